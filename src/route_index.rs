//! The engine's route index: finds the first route, in config order, that takes a
//! request, without trying every route's matcher in turn.
//!
//! Each kind of path pattern has a structure that gives exactly the routes of that
//! kind whose path matches:
//!
//! - exact paths and prefixes, in one byte trie with single-child chains merged (a
//!   radix tree): walking the request's path down it passes through every prefix the
//!   path starts with, and through its exact path (without a trailing slash, as an
//!   exact path matches with or without one) if a route has it;
//! - templates, in a trie of segments, literal or parameter (a parameter takes any
//!   non-empty segment), walked by the request's segments down every branch that
//!   matches; a template that ends in a catch-all (`{*rest}`) is held by the node of
//!   the segments before it, and taken there if the rest of the path is not empty.
//!
//! Of the routes whose path matches, the one taken is the lowest in config order whose
//! method matches too: the same route as trying every matcher in config order, first
//! match wins. The cost grows with the path's length and with the routes that share
//! it, not with the table. Both tries are flat arrays: the index costs a route about
//! a hundred bytes (tests/memory.rs).
//!
//! The tries as they are built, route by route ([`RouteTries`]), also serve the config
//! check that refuses a route an earlier one shadows (`src/config/raw.rs`): walked by
//! a later route's pattern rather than by a request's path, they give the earlier
//! routes whose path could take every path of the later one, so that it is compared
//! with those, not with every route before it.

use crate::config::{
    literal_lead, without_trailing_empty, without_trailing_slash, PathPattern, RouteMatch, Segment,
    TemplatePath,
};
use smallvec::SmallVec;
use std::collections::HashMap;

/// A run of a flat array: `len` items from `start`.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    /// The items of `all` this span covers.
    #[inline]
    fn of<T>(self, all: &[T]) -> &[T] {
        all.get(self.start..self.start + self.len)
            .unwrap_or_default()
    }

    /// The span of the items pushed onto `all` from `items`.
    fn push<T: Clone>(all: &mut Vec<T>, items: &[T]) -> Span {
        let start = all.len();
        all.extend_from_slice(items);
        Span {
            start,
            len: items.len(),
        }
    }
}

/// The routes of a table, indexed by path.
#[derive(Debug)]
pub(crate) struct RouteIndex {
    /// Exact paths and prefixes.
    paths: Radix,
    /// Templates.
    templates: Segments,
}

impl RouteIndex {
    /// The index of `matchers`, in config order.
    pub(crate) fn new(matchers: &[RouteMatch]) -> Self {
        let mut tries = RouteTries::default();
        for (i, m) in matchers.iter().enumerate() {
            tries.insert(i, &m.path);
        }
        RouteIndex {
            paths: Radix::new(&tries.paths),
            templates: Segments::new(tries.templates),
        }
    }

    /// The first route of `matchers` (the table this index was built from) that takes
    /// a request with this method and path (normalized).
    pub(crate) fn first(&self, matchers: &[RouteMatch], method: &str, path: &str) -> Option<usize> {
        let mut best = First {
            matchers,
            method,
            route: usize::MAX,
        };
        self.paths.visit(path, &mut best);
        self.templates.visit(path, &mut best);
        (best.route != usize::MAX).then_some(best.route)
    }
}

/// Routes by path, added one by one in config order: what a [`RouteIndex`] is
/// flattened from, and what the config check asks for the earlier routes that may
/// shadow a later one ([`RouteTries::first_covering`]).
#[derive(Debug, Default)]
pub(crate) struct RouteTries {
    /// Exact paths (without a trailing slash) and prefixes.
    paths: ByteTrie,
    /// Templates.
    templates: SegmentTrie,
}

impl RouteTries {
    /// Adds `route`, whose path is `path`: a number above every route's added before.
    pub(crate) fn insert(&mut self, route: usize, path: &PathPattern) {
        match path {
            PathPattern::Exact(p) => self.paths.insert(without_trailing_slash(p), route, true),
            PathPattern::Prefix(p) => self.paths.insert(p, route, false),
            PathPattern::Template(segments) => self.templates.insert(segments, route),
        }
    }

    /// The lowest route added for which `covers` holds, asked only of the routes whose
    /// path could take every path `later` matches (each in config order, none after
    /// one for which it held): for an exact path, those whose pattern matches it
    /// without its trailing slash; for a prefix, the prefixes it starts with and the
    /// catch-alls that take every path under it; for a template, the prefixes its
    /// literal lead starts with and the templates that match every path it does.
    /// `covers` decides: each of these is the condition its route's path needs to
    /// take every path of `later` (an exact path's other spelling, the methods aside),
    /// so a route for which it holds is among them. The cost grows with the routes
    /// that could take `later`'s paths, and with its walk down the tries: the lengths
    /// of its path and, for a template, the parameters of the earlier templates it
    /// passes, not with the routes added.
    pub(crate) fn first_covering(
        &self,
        later: &PathPattern,
        mut covers: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let mut first = usize::MAX;
        let mut consider = |routes: &[usize]| {
            for &route in routes {
                if route >= first {
                    return;
                }
                if covers(route) {
                    first = route;
                    return;
                }
            }
        };
        match later {
            PathPattern::Exact(path) => {
                let bare = without_trailing_slash(path);
                for node in self.paths.along(bare) {
                    consider(&node.prefix);
                }
                // An exact path matches `bare` if it is the same without its trailing
                // slash, as it is held.
                let key = without_trailing_slash(bare);
                if let Some(node) = self.paths.along(key).nth(key.len()) {
                    consider(&node.exact);
                }
                let bare = TemplatePath::new(bare);
                self.templates.matching(&bare, &mut consider);
            }
            PathPattern::Prefix(prefix) => {
                for node in self.paths.along(prefix) {
                    consider(&node.prefix);
                }
                if let Some(rest) = prefix.strip_prefix('/') {
                    self.templates.catching(rest, &mut consider);
                }
            }
            PathPattern::Template(segments) => {
                for node in self.paths.along(&literal_lead(segments)) {
                    consider(&node.prefix);
                }
                self.templates
                    .covering(without_trailing_empty(segments), &mut consider);
            }
        }
        (first != usize::MAX).then_some(first)
    }
}

/// The first route found so far whose path and method match.
struct First<'a> {
    matchers: &'a [RouteMatch],
    method: &'a str,
    /// `usize::MAX` until one is found.
    route: usize,
}

impl First<'_> {
    /// Takes the first of `routes` (whose paths match) whose method matches, if it
    /// comes before the route found so far.
    #[inline]
    fn consider(&mut self, routes: &[usize]) {
        for &i in routes {
            if i >= self.route {
                return;
            }
            if self.matchers[i].takes_method(self.method) {
                self.route = i;
                return;
            }
        }
    }
}

/// A node of [`ByteTrie`].
#[derive(Debug, Default)]
struct ByteNode {
    /// The next byte of a longer path, and its node, in byte order.
    children: std::collections::BTreeMap<u8, usize>,
    /// The routes whose prefix ends here.
    prefix: Vec<usize>,
    /// The routes whose exact path (without a trailing slash) ends here.
    exact: Vec<usize>,
}

/// Exact paths and prefixes byte by byte, as built (then flattened into a [`Radix`]).
#[derive(Debug)]
struct ByteTrie {
    /// The root (the empty path) first.
    nodes: Vec<ByteNode>,
}

impl Default for ByteTrie {
    fn default() -> Self {
        ByteTrie {
            nodes: vec![ByteNode::default()],
        }
    }
}

impl ByteTrie {
    fn insert(&mut self, path: &str, route: usize, exact: bool) {
        let mut at = 0;
        for &b in path.as_bytes() {
            let fresh = self.nodes.len();
            at = *self.nodes[at].children.entry(b).or_insert(fresh);
            if at == fresh {
                self.nodes.push(ByteNode::default());
            }
        }
        let node = &mut self.nodes[at];
        if exact {
            node.exact.push(route);
        } else {
            node.prefix.push(route);
        }
    }

    /// The nodes of `path`'s first bytes, from none (the root) to all of them, as far
    /// as the trie holds them: each holds the routes whose path is those bytes.
    fn along<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a ByteNode> + 'a {
        let below = path.bytes().scan(0, |at, b| {
            *at = *self.nodes[*at].children.get(&b)?;
            Some(*at)
        });
        std::iter::once(0).chain(below).map(|at| &self.nodes[at])
    }
}

/// A node of [`Radix`].
#[derive(Debug, Default)]
struct RadixNode {
    /// The bytes from the parent to this node, in [`Radix::labels`].
    label: Span,
    /// Its children, in [`Radix::edges`].
    edges: Span,
    /// The routes whose prefix ends here, in [`Radix::routes`].
    prefix: Span,
    /// The routes whose exact path (without a trailing slash) ends here.
    exact: Span,
    /// The lowest route here or below (`usize::MAX` if none): a route found before it
    /// needs no walk down here.
    lowest: usize,
}

/// A [`ByteTrie`] with every chain of nodes that hold no route and have one child
/// merged into one node, in flat arrays.
#[derive(Debug)]
struct Radix {
    /// The root (the empty path) first.
    nodes: Vec<RadixNode>,
    /// Each node's children: the first byte of the child's label, and the child, in
    /// byte order.
    edges: Vec<(u8, usize)>,
    /// Every node's label, one after another.
    labels: Vec<u8>,
    /// Every node's routes, each node's in config order.
    routes: Vec<usize>,
}

impl Radix {
    fn new(trie: &ByteTrie) -> Self {
        let mut radix = Radix {
            nodes: vec![RadixNode::default()],
            edges: Vec::new(),
            labels: Vec::new(),
            routes: Vec::new(),
        };
        // (node of the trie, its node in the radix tree), breadth first.
        let mut queue = std::collections::VecDeque::from([(0, 0)]);
        while let Some((from, to)) = queue.pop_front() {
            let node = &trie.nodes[from];
            let prefix = Span::push(&mut radix.routes, &node.prefix);
            let exact = Span::push(&mut radix.routes, &node.exact);
            let edges_start = radix.edges.len();
            for (&first, &child) in &node.children {
                let label_start = radix.labels.len();
                radix.labels.push(first);
                let mut end = child;
                loop {
                    let n = &trie.nodes[end];
                    let only = match n.children.first_key_value() {
                        Some((&b, &next)) if n.children.len() == 1 => (b, next),
                        _ => break,
                    };
                    if !n.prefix.is_empty() || !n.exact.is_empty() {
                        break;
                    }
                    radix.labels.push(only.0);
                    end = only.1;
                }
                let at = radix.nodes.len();
                radix.nodes.push(RadixNode {
                    label: Span {
                        start: label_start,
                        len: radix.labels.len() - label_start,
                    },
                    ..RadixNode::default()
                });
                radix.edges.push((first, at));
                queue.push_back((end, at));
            }
            let own = node.prefix.iter().chain(&node.exact).copied().min();
            let node = &mut radix.nodes[to];
            node.lowest = own.unwrap_or(usize::MAX);
            node.prefix = prefix;
            node.exact = exact;
            node.edges = Span {
                start: edges_start,
                len: radix.edges.len() - edges_start,
            };
        }
        // Breadth first, children come after their parents.
        for at in (0..radix.nodes.len()).rev() {
            let below = radix.nodes[at]
                .edges
                .of(&radix.edges)
                .iter()
                .map(|&(_, child)| radix.nodes[child].lowest)
                .min()
                .unwrap_or(usize::MAX);
            radix.nodes[at].lowest = radix.nodes[at].lowest.min(below);
        }
        radix.nodes.shrink_to_fit();
        radix.edges.shrink_to_fit();
        radix.labels.shrink_to_fit();
        radix.routes.shrink_to_fit();
        radix
    }

    /// Offers `best` the routes of every prefix `path` starts with, and of its exact
    /// path.
    fn visit(&self, path: &str, best: &mut First<'_>) {
        let exact_len = without_trailing_slash(path).len();
        let path = path.as_bytes();
        let mut node = &self.nodes[0];
        let mut at = 0;
        loop {
            if best.route <= node.lowest {
                return;
            }
            best.consider(node.prefix.of(&self.routes));
            if at == exact_len {
                best.consider(node.exact.of(&self.routes));
            }
            if best.route <= node.lowest {
                return;
            }
            let Some(&b) = path.get(at) else {
                return;
            };
            let edges = node.edges.of(&self.edges);
            let Ok(i) = edges.binary_search_by_key(&b, |&(first, _)| first) else {
                return;
            };
            let child = &self.nodes[edges[i].1];
            let label = child.label.of(&self.labels);
            if !starts_with(&path[at..], label) {
                return;
            }
            at += label.len();
            node = child;
        }
    }
}

/// A node of [`SegmentTrie`].
#[derive(Debug, Default)]
struct SegmentNode {
    /// A literal next segment, and its node.
    literals: HashMap<String, usize>,
    /// A parameter as the next segment: its node.
    param: Option<usize>,
    /// The routes whose template ends here.
    routes: Vec<usize>,
    /// The routes whose template ends here in a catch-all: they take the rest of the
    /// path, if it is not empty.
    catch_all: Vec<usize>,
}

/// Path templates segment by segment, as built (then flattened into [`Segments`]).
/// Every node comes after its parent.
#[derive(Debug)]
struct SegmentTrie {
    /// The root (no segment yet) first.
    nodes: Vec<SegmentNode>,
}

impl Default for SegmentTrie {
    fn default() -> Self {
        SegmentTrie {
            nodes: vec![SegmentNode::default()],
        }
    }
}

impl SegmentTrie {
    fn insert(&mut self, segments: &[Segment], route: usize) {
        // A trailing slash is no segment, as for a template's match.
        let segments = without_trailing_empty(segments);
        let mut at = 0;
        for (i, segment) in segments.iter().enumerate() {
            let next = match segment {
                Segment::Literal(l) => self.nodes[at].literals.get(l).copied(),
                // Last, it takes the rest of the path from this node; elsewhere, the
                // template matches no path.
                Segment::CatchAll(_) => {
                    if i + 1 == segments.len() {
                        self.nodes[at].catch_all.push(route);
                    }
                    return;
                }
                _ => self.nodes[at].param,
            };
            at = match next {
                Some(next) => next,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(SegmentNode::default());
                    match segment {
                        Segment::Literal(l) => {
                            self.nodes[at].literals.insert(l.clone(), next);
                        }
                        _ => self.nodes[at].param = Some(next),
                    }
                    next
                }
            };
        }
        self.nodes[at].routes.push(route);
    }

    /// Offers `found` the routes whose template matches the request's `path`: as
    /// [`Segments::visit`] finds them, every one. The walk keeps the nodes still to
    /// visit in a stack of its own, not the thread's: a route's path may be as many
    /// segments deep as its file makes it.
    fn matching(&self, path: &TemplatePath<'_>, found: &mut impl FnMut(&[usize])) {
        // Each node to visit, with the path's segments not yet read (`None` once every
        // one is).
        let mut to_visit = vec![(0, Some(path.segments()))];
        while let Some((at, rest)) = to_visit.pop() {
            let node = &self.nodes[at];
            let Some(rest) = rest else {
                found(&node.routes);
                continue;
            };
            if path.catches(rest) {
                found(&node.catch_all);
            }
            let (part, next) = match rest.split_once('/') {
                Some((part, next)) => (part, Some(next)),
                None => (rest, None),
            };
            if let Some(&literal) = node.literals.get(part) {
                to_visit.push((literal, next));
            }
            if let Some(param) = node.param.filter(|_| !part.is_empty()) {
                to_visit.push((param, next));
            }
        }
    }

    /// Offers `found` the routes whose template ends in a catch-all that takes every
    /// path starting with `/` and `rest`: each segment before the catch-all takes a
    /// segment of `rest` that a slash ends, and some text follows them. Without
    /// recursion, as [`matching`](Self::matching).
    fn catching(&self, rest: &str, found: &mut impl FnMut(&[usize])) {
        // Each node to visit, with the part of `rest` not yet read.
        let mut to_visit = vec![(0, rest)];
        while let Some((at, rest)) = to_visit.pop() {
            let node = &self.nodes[at];
            if !rest.is_empty() {
                found(&node.catch_all);
            }
            let Some((part, next)) = rest.split_once('/') else {
                continue;
            };
            if let Some(&literal) = node.literals.get(part) {
                to_visit.push((literal, next));
            }
            if let Some(param) = node.param.filter(|_| !part.is_empty()) {
                to_visit.push((param, next));
            }
        }
    }

    /// Offers `found` the routes whose template matches every path that the template
    /// `segments` (a later route's) matches: as many segments, each a parameter or the
    /// same literal (a parameter covers a literal that is not empty, and only a
    /// parameter covers one), or fewer before a catch-all, with at least one segment of
    /// `segments` past them. Without recursion, as [`matching`](Self::matching).
    fn covering(&self, segments: &[Segment], found: &mut impl FnMut(&[usize])) {
        // Each node to visit, with the segments not yet read.
        let mut to_visit = vec![(0, segments)];
        while let Some((at, rest)) = to_visit.pop() {
            let node = &self.nodes[at];
            let Some((segment, next)) = rest.split_first() else {
                found(&node.routes);
                continue;
            };
            found(&node.catch_all);
            let (literal, param) = match segment {
                Segment::Literal(l) => (node.literals.get(l), !l.is_empty()),
                Segment::Param(_) => (None, true),
                Segment::CatchAll(_) => (None, false),
            };
            if let Some(&literal) = literal {
                to_visit.push((literal, next));
            }
            if let Some(param) = node.param.filter(|_| param) {
                to_visit.push((param, next));
            }
        }
    }
}

/// A literal segment of [`Segments`].
#[derive(Debug)]
struct Literal {
    /// Its first 8 bytes ([`key`]): most comparisons end here.
    key: u64,
    /// Its text, in [`Segments::text`].
    text: Span,
    /// The node it leads to.
    node: usize,
}

/// A node of [`Segments`].
#[derive(Debug)]
struct SegmentsNode {
    /// Its literal next segments, in [`Segments::literals`], in [`literal_order`].
    literals: Span,
    /// The node a parameter as the next segment leads to, if any.
    param: Option<usize>,
    /// The routes whose template ends here, in [`Segments::routes`].
    routes: Span,
    /// The routes whose template ends here in a catch-all, in [`Segments::routes`].
    catch_all: Span,
    /// The lowest route here or below (`usize::MAX` if none): a route found before it
    /// needs no walk down here.
    lowest: usize,
}

/// A [`SegmentTrie`] in flat arrays.
#[derive(Debug)]
struct Segments {
    /// The root first, every node after its parent.
    nodes: Vec<SegmentsNode>,
    literals: Vec<Literal>,
    /// Every literal's text, one after another.
    text: Vec<u8>,
    /// Every node's routes, each node's in config order.
    routes: Vec<usize>,
}

/// The first 8 bytes of `s`, zero-padded, as one number.
#[inline]
fn key(s: &[u8]) -> u64 {
    let mut k = 0;
    for (i, &b) in s.iter().take(8).enumerate() {
        k |= u64::from(b) << (56 - 8 * i);
    }
    k
}

/// An order of segments that mostly compares numbers: by their first 8 bytes, their
/// length, and the rest. Two segments are equal in it only if they are the same.
#[inline]
fn literal_order(key_a: u64, a: &[u8], key_b: u64, b: &[u8]) -> std::cmp::Ordering {
    key_a
        .cmp(&key_b)
        .then(a.len().cmp(&b.len()))
        .then_with(|| a.get(8..).cmp(&b.get(8..)))
}

impl Segments {
    fn new(trie: SegmentTrie) -> Self {
        let mut flat = Segments {
            nodes: Vec::with_capacity(trie.nodes.len()),
            literals: Vec::new(),
            text: Vec::new(),
            routes: Vec::new(),
        };
        for node in &trie.nodes {
            let start = flat.literals.len();
            for (l, next) in &node.literals {
                let text = Span::push(&mut flat.text, l.as_bytes());
                flat.literals.push(Literal {
                    key: key(l.as_bytes()),
                    text,
                    node: *next,
                });
            }
            let (text, literals) = (&flat.text, &mut flat.literals[start..]);
            literals.sort_unstable_by(|a, b| {
                literal_order(a.key, a.text.of(text), b.key, b.text.of(text))
            });
            flat.nodes.push(SegmentsNode {
                literals: Span {
                    start,
                    len: node.literals.len(),
                },
                param: node.param,
                routes: Span::push(&mut flat.routes, &node.routes),
                catch_all: Span::push(&mut flat.routes, &node.catch_all),
                lowest: node
                    .routes
                    .iter()
                    .chain(&node.catch_all)
                    .copied()
                    .min()
                    .unwrap_or(usize::MAX),
            });
        }
        // Children come after their parents: the last nodes' lowest are whole first.
        for at in (0..flat.nodes.len()).rev() {
            let node = &flat.nodes[at];
            let below = node
                .literals
                .of(&flat.literals)
                .iter()
                .map(|l| l.node)
                .chain(node.param)
                .map(|child| flat.nodes[child].lowest)
                .min()
                .unwrap_or(usize::MAX);
            flat.nodes[at].lowest = flat.nodes[at].lowest.min(below);
        }
        flat.literals.shrink_to_fit();
        flat.text.shrink_to_fit();
        flat.routes.shrink_to_fit();
        flat
    }

    /// Offers `best` the routes of every template `path` matches, down every branch
    /// of the trie that matches (a literal's before a parameter's), each cut short
    /// where no route below comes before the one found.
    fn visit(&self, path: &str, best: &mut First<'_>) {
        if self
            .nodes
            .first()
            .is_none_or(|root| best.route <= root.lowest)
        {
            return;
        }
        let path = TemplatePath::new(path);
        // Each node still to visit, with the segments not yet read (`None` once every
        // one is), in a stack of its own, not the thread's: a route's template may be
        // as many segments deep as its file makes it, and a request as long, and a
        // call per segment overflowed a 2 MiB thread stack at 8,000 segments (which
        // aborts the process). It grows only where both a literal and a parameter
        // match a segment: sixteen fit inline, more spill to the heap.
        let mut to_visit: SmallVec<[(usize, Option<&str>); 16]> = SmallVec::new();
        to_visit.push((0, Some(path.segments())));
        while let Some((at, rest)) = to_visit.pop() {
            let node = &self.nodes[at];
            if best.route <= node.lowest {
                continue;
            }
            let Some(rest) = rest else {
                best.consider(node.routes.of(&self.routes));
                continue;
            };
            if node.catch_all.len > 0 && path.catches(rest) {
                best.consider(node.catch_all.of(&self.routes));
            }
            let (part, next) = match rest.split_once('/') {
                Some((part, next)) => (part.as_bytes(), Some(next)),
                None => (rest.as_bytes(), None),
            };
            // The parameter's branch goes in first, so that the literal's is visited
            // first.
            if let Some(param) = node.param.filter(|_| !part.is_empty()) {
                to_visit.push((param, next));
            }
            let k = key(part);
            let literals = node.literals.of(&self.literals);
            let found =
                literals.binary_search_by(|l| literal_order(l.key, l.text.of(&self.text), k, part));
            if let Ok(i) = found {
                to_visit.push((literals[i].node, next));
            }
        }
    }
}

/// Whether `text` starts with `prefix`, compared 8 bytes at a time: labels are short,
/// and a call to `memcmp` would cost more than comparing them.
#[inline]
fn starts_with(text: &[u8], prefix: &[u8]) -> bool {
    let Some(text) = text.get(..prefix.len()) else {
        return false;
    };
    let mut words = text.chunks_exact(8).zip(prefix.chunks_exact(8));
    let whole = words.all(|(a, b)| key(a) == key(b));
    let tail = prefix.len() - prefix.len() % 8;
    whole
        && text[tail..]
            .iter()
            .zip(&prefix[tail..])
            .all(|(a, b)| a == b)
}

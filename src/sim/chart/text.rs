//! Text for the chart: a drawing backend wrapper that measures every label with the
//! bundled font and, on a bitmap, draws its glyphs (ab_glyph), so that neither the
//! layout nor the PNG's letters depend on a system font or on plotters' global font
//! registry.

use ab_glyph::{point, Font, FontRef, GlyphId, InvalidFont, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// DejaVu Sans, reduced to Latin-1 and a few symbols (licence:
/// `assets/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../../../assets/DejaVuSans-subset.ttf");

/// A backend whose text is set in the bundled font: measured for layout always, and
/// drawn glyph by glyph when `raster` (a bitmap); otherwise left to the inner backend
/// (SVG writes `<text>` elements).
pub(super) struct Typeset<B> {
    inner: B,
    font: FontRef<'static>,
    raster: bool,
}

type Drawn<B> = Result<(), DrawingErrorKind<<B as DrawingBackend>::ErrorType>>;

impl<B: DrawingBackend> Typeset<B> {
    pub(super) fn new(inner: B, raster: bool) -> Result<Self, InvalidFont> {
        Ok(Typeset {
            inner,
            font: FontRef::try_from_slice(FONT)?,
            raster,
        })
    }

    /// Each glyph of `text` with its pen position, and the text's width, at `size` px.
    fn layout(&self, text: &str, size: f64) -> (Vec<(GlyphId, f32)>, f32) {
        let scaled = self.font.as_scaled(PxScale::from(size as f32));
        let mut x = 0.0;
        let mut previous = None;
        let glyphs = text
            .chars()
            .map(|c| {
                let id = scaled.glyph_id(c);
                if let Some(p) = previous {
                    x += scaled.kern(p, id);
                }
                let at = x;
                x += scaled.h_advance(id);
                previous = Some(id);
                (id, at)
            })
            .collect();
        (glyphs, x)
    }

    /// The height of a line of text at `size` px: ascent to descent.
    fn line_height(&self, size: f64) -> f32 {
        let scaled = self.font.as_scaled(PxScale::from(size as f32));
        scaled.ascent() - scaled.descent()
    }
}

impl<B: DrawingBackend> DrawingBackend for Typeset<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Drawn<B> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Drawn<B> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Drawn<B> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Drawn<B> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Drawn<B> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Drawn<B> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Drawn<B> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Drawn<B> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Drawn<B> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let (_, width) = self.layout(text, style.size());
        Ok((
            width.ceil() as u32,
            self.line_height(style.size()).ceil() as u32,
        ))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Drawn<B> {
        if !self.raster {
            return self.inner.draw_text(text, style, pos);
        }
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let scale = PxScale::from(style.size() as f32);
        let ascent = self.font.as_scaled(scale).ascent();
        let (glyphs, width) = self.layout(text, style.size());
        let height = self.line_height(style.size());
        let dx = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let mut pixels = Vec::new();
        for (id, x) in glyphs {
            let glyph = id.with_scale_and_position(scale, point(x + dx, ascent + dy));
            if let Some(outline) = self.font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                outline.draw(|gx, gy, coverage| {
                    let x = bounds.min.x as i32 + gx as i32;
                    let y = bounds.min.y as i32 + gy as i32;
                    pixels.push((transform.transform(x, y), coverage));
                });
            }
        }
        for ((x, y), coverage) in pixels {
            if coverage > 0.0 {
                let alpha = color.alpha * f64::from(coverage.min(1.0));
                self.inner
                    .draw_pixel((pos.0 + x, pos.1 + y), BackendColor { alpha, ..color })?;
            }
        }
        Ok(())
    }
}

# shellcheck shell=bash
# Sourced by scripts/bench-http.sh, scripts/callgrind-http.sh, scripts/proxy-ab.sh,
# scripts/bench-cap.sh and scripts/callgrind-proxy-protocol.sh: the configurations of
# `rocgate serve` and nginx that the proxy benchmarks compare, written the same way for
# both so that the two measure the same thing.

# Writes to $1 a rocgate config: one route for every path limited to $2 req/s with a
# bucket of one second, forwarding to the upstream URL $3, both listeners on free
# loopback ports. $4, when given, is more lines of its [server] table (such as
# `proxy_protocol = "any"`).
write_rocgate_config() {
    local file=$1 rate=$2 upstream=$3 server=${4:-}
    cat >"$file" <<TOML
[defaults]
base_limit = $rate
cut_limit = $rate
algorithm = "token_bucket"
burst = "1s"

[[routes]]
name = "all"
path_prefix = "/"

[server]
listen = "127.0.0.1:0"
upstream = "$upstream"
$server

[admin]
listen = "127.0.0.1:0"
TOML
}

# Writes $1/nginx.conf: one worker in the foreground listening on 127.0.0.1:$2,
# limit_req at $3 r/s with a burst of as many and `nodelay` (status 429), keep-alive
# connections to the upstream host:port $4, no access log. $5, when given, is one more
# main-context directive (such as `master_process off;`).
write_nginx_config() {
    local prefix=$1 port=$2 rate=$3 upstream=$4 extra=${5:-}
    cat >"$prefix/nginx.conf" <<NGINX
worker_processes 1;
$extra
daemon off;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;
    limit_req_zone \$server_name zone=bench:1m rate=${rate}r/s;
    limit_req_status 429;
    upstream up {
        server $upstream;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$port;
        server_name bench;
        location / {
            limit_req zone=bench burst=$rate nodelay;
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
}

#!/usr/bin/env python3
"""A static file server for the web tests and the demo: HTTP Range requests (206), HEAD, and
`POST /result` which appends the posted JSON to --results (how test pages report back). With
--results (test mode only) `POST /copy` with {"from": path, "to": path} replaces a served file
by another one (how a test changes a model file under a page), and a file F beside which
`F.http-status` holds a number is answered with that status (how a test makes a server fail).

  scripts/web-serve.py --root .. --port 8000 [--results out.jsonl] [--print-url /path]
"""
import argparse, http.server, json, os, re, shutil, sys


class Handler(http.server.SimpleHTTPRequestHandler):
    results = None

    def log_message(self, fmt, *args):
        pass

    def end_headers(self):
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        if self.path == "/result" and Handler.results:
            with open(Handler.results, "ab") as f:
                f.write(body.replace(b"\n", b" ") + b"\n")
        if self.path == "/copy" and Handler.results:
            a = json.loads(body)
            src, dst = self.translate_path(a["from"]), self.translate_path(a["to"])
            shutil.copyfile(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        self.send_response(204)
        self.end_headers()

    def forced_status(self):
        p = self.translate_path(self.path) + ".http-status"
        if not Handler.results or not os.path.isfile(p):
            return False
        with open(p) as f:
            self.send_response(int(f.read().strip()))
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_HEAD(self):
        if not self.forced_status():
            super().do_HEAD()

    def do_GET(self):
        if self.forced_status():
            return
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not m or not os.path.isfile(path):
            return super().do_GET()
        size = os.path.getsize(path)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        if start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left:
                chunk = f.read(min(left, 1 << 20))
                self.wfile.write(chunk)
                left -= len(chunk)


Handler.extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript", ".wasm": "application/wasm", ".mjs": "text/javascript"}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--results")
    ap.add_argument("--print-url", help="also print 'open http://127.0.0.1:PORT/PATH' once listening")
    a = ap.parse_args()
    Handler.results = a.results
    os.chdir(a.root)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(f"serving {os.getcwd()} on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    if a.print_url:
        print(f"open http://127.0.0.1:{srv.server_address[1]}{a.print_url}", flush=True)
    srv.serve_forever()

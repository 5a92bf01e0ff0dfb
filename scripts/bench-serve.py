#!/usr/bin/env python3
"""Throughput of an OpenAI-compatible chat server: requests/s and aggregate completion tokens/s
with C concurrent clients (standard library only).

  scripts/bench-serve.py --url http://127.0.0.1:8080 --clients 1 4 16 --requests 16 --max-tokens 16

Each client sends its share of the requests one after another (greedy, distinct prompts, fixed
max_tokens); the clock runs from the first send to the last answer. Works against `tildeopen
serve` and llama.cpp's `llama-server` alike.
"""
import argparse, json, threading, time, urllib.request

PROMPTS = ["What is the capital of Latvia?", "Name three primary colors.", "What is 12 times 12?",
           "Give a synonym for happy.", "What language is spoken in Estonia?", "Describe the sea in five words.",
           "What is the boiling point of water?", "Who wrote Hamlet?"]


def one(url, i, max_tokens):
    body = json.dumps({"messages": [{"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} (request {i})"}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def run(url, clients, requests, max_tokens):
    tokens, errors, lock = [0], [0], threading.Lock()
    def worker(c):
        for i in range(c, requests, clients):
            try:
                n = one(url, i, max_tokens)
                with lock:
                    tokens[0] += n
            except Exception as e:  # counted, not fatal
                with lock:
                    errors[0] += 1
    t0 = time.time()
    ts = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    dt = time.time() - t0
    return {"clients": clients, "requests": requests, "errors": errors[0], "seconds": round(dt, 2),
            "requests_per_s": round(requests / dt, 4), "completion_tokens_per_s": round(tokens[0] / dt, 3)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    one(a.url, 0, 2)  # warm-up
    for c in a.clients:
        print(json.dumps(run(a.url, c, a.requests, a.max_tokens)), flush=True)

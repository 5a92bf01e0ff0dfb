#!/usr/bin/env python3
"""Fidelity on whatever GPU runs it: `tildeopen logits` on a fixture GGUF against its golden
(transformers' logits from the same dequantized weights), with an f32 KV cache, the tolerances the
fixtures' README names (max |logit - golden| <= 0.01 at every position, in one pass over all of
them and in one over the first 12; greedy tokens identical up to the first step whose margin is
under 0.05). For a machine where the
Rust test suite cannot run (scripts/gpu-bench's fidelity section); the tests hold the same bound.

  scripts/golden-check.py CLI MODEL.gguf [MODEL.golden.safetensors]

Prints one JSON line (max and p99 |diff|, positions, pass) and exits 1 when the bound is missed.
The environment (TILDEOPEN_SUBGROUPS, TILDEOPEN_NORM_FOLD, ...) picks the kernels."""
import json, os, struct, subprocess, sys
import numpy as np

cli, model = sys.argv[1], sys.argv[2]
golden = sys.argv[3] if len(sys.argv) > 3 else model.replace('.gguf', '.golden.safetensors')
with open(golden, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    head = json.loads(f.read(n))
    data = f.read()
def tensor(name):
    t = head[name]
    a, b = t['data_offsets']
    return np.frombuffer(data[a:b], dtype={'F32': np.float32, 'I32': np.int32}[t['dtype']]).reshape(t['shape'])
ids, want = tensor('input_ids'), tensor('logits')
env = {**os.environ, 'XDG_RUNTIME_DIR': os.environ.get('XDG_RUNTIME_DIR', '/tmp')}
def run(*args):
    out = subprocess.run([cli, *args, '--model', model, '--kv-cache', 'f32'], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f'tildeopen {args[0]} failed: {out.stderr[-600:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])
def logits(n):
    got = np.array(run('logits', '--tokens', ','.join(map(str, ids[:n])))['logits'], dtype=np.float32)
    if got.shape != want[:n].shape:
        sys.exit(f'logits shape {got.shape}, golden {want[:n].shape}')
    return got
# One pass over every position (the prefill kernels), one over the first 12 (the matvecs that
# decode runs), and greedy decoding (one token per pass) against the golden continuation.
long, short = logits(len(ids)), logits(12)
d = np.abs(long - want)
ds = np.abs(short - want[:12])
prompt, greedy, margins = tensor('prompt_ids'), tensor('greedy_ids'), tensor('greedy_margins')
gen = run('complete', '--tokens', ','.join(map(str, prompt)), '--max-tokens', str(len(greedy)), '--json')['ids']
sure = next((i for i, m in enumerate(margins) if m < 0.05), len(greedy))
greedy_ok = list(gen[:sure]) == [int(x) for x in greedy[:sure]]
switches = ['TILDEOPEN_SUBGROUPS', 'TILDEOPEN_NORM_FOLD', 'TILDEOPEN_INT_DOT', 'TILDEOPEN_BASELINE_KERNELS', 'TILDEOPEN_QUERY_TILES']
res = {'fidelity': os.path.basename(os.path.dirname(model)) + '/' + os.path.basename(model),
       'env': {k: os.environ[k] for k in switches if k in os.environ}, 'positions': int(d.shape[0]),
       'max_abs': round(float(d.max()), 5), 'p99_abs': round(float(np.percentile(d, 99)), 5), 'short_pass_max_abs': round(float(ds.max()), 5),
       'argmax_equal': float((long.argmax(1) == want.argmax(1)).mean()), 'greedy_equal_steps': f'{sure}/{len(greedy)} {"ok" if greedy_ok else "DIFFER"}'}
res['pass'] = bool(d.max() <= 0.01 and ds.max() <= 0.01 and greedy_ok)
print(json.dumps(res))
sys.exit(0 if res['pass'] else 1)

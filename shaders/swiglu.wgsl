// G = silu(G) * U in place, f32 (TildeOpen's last layer exceeds f16's range here).

struct EltParams {
    n: u32, // elements per token
}
@group(0) @binding(0) var<storage, read> U: array<f32>;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<uniform> p: EltParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 64u + gid.x;
    if (i >= step.t * p.n) {
        return;
    }
    let g = G[i];
    G[i] = g / (1.0 + exp(-g)) * U[i];
}

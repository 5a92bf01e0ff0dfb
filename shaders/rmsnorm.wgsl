// OUT[t, :] = X[t, :] / sqrt(mean(X[t, :]^2) + eps) * weight, one workgroup per token, f32.
// Prepended: rms.wgsl.

@group(0) @binding(0) var<storage, read> WEIGHT: array<f32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(3) var<uniform> p: NormParams;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    let base = t * p.n;
    let r = rms_scale(lid, base);
    for (var i = lid; i < p.n; i += 256u) {
        OUT[base + i] = WEIGHT[i] * (X[base + i] * r);
    }
}

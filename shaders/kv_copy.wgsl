// Copies the first rows of one sequence's KV cache span to another's (both K and V of one layer):
// a new request whose prompt starts like a sequence already in the cache (a shared system prompt,
// a task's instructions) reuses those keys and values instead of recomputing them. One thread
// per u32 word; the spans never overlap.

struct CopyParams {
    src: u32,   // first word of the source rows
    dst: u32,   // first word of the destination rows
    words: u32, // words to copy
}
@group(0) @binding(0) var<storage, read_write> KC: array<u32>;
@group(0) @binding(1) var<storage, read_write> VC: array<u32>;
@group(0) @binding(2) var<uniform> p: CopyParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 64u + gid.x;
    if (i >= p.words) {
        return;
    }
    KC[p.dst + i] = KC[p.src + i];
    VC[p.dst + i] = VC[p.src + i];
}

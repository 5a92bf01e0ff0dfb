// y[t, n] (+)= dot(W[n, :], x[t, :]) for a few tokens, on devices with subgroups (the
// `subgroups` fast path; matvec.wgsl is the fallback). One workgroup of WG threads per NR = 4
// rows: the threads take the rows' 32-element blocks in turn (adjacent threads read adjacent
// blocks), load each block's slice of x once per token and apply it to the four rows. Then per
// token: subgroupAdd sums the partials of each subgroup, one invocation per subgroup stores them
// in workgroup memory, and thread b adds the subgroups' sums for token b. Every thread works on
// the same rows, so which invocations form a subgroup (WGSL does not say) does not matter. Each
// subgroup's lowest invocation sets its bit in a workgroup mask, and the subgroup's slot is the
// number of such leaders below it: the subgroups' sums are added in invocation order, the same
// every run (a slot taken with a counter would follow the order in which subgroups happen to run,
// and the float sums would differ in their last bits from one run to the next).
// NT (1 for one-token passes, MAX_T else) bounds the token loops by a constant so `acc` stays in
// registers. With NORM the kernel also applies the RMSNorm that feeds the matrix (mat_norm.wgsl).
// Prepended: bytes.wgsl, the weight type's dot32, mat_out.wgsl and mat_norm.wgsl (as matvec.wgsl).

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;

override ACCUMULATE: bool = false;
// Rows come in (gate, up) pairs (row 2i gate i, row 2i + 1 up i): Y[i] = silu(gate) * up.
override GLU: bool = false;
override WG: u32 = 64u;
const NR: u32 = 4u;
const MAX_T: u32 = 8u;
override NT: u32 = MAX_T;
// [subgroup][token]: at most WG / 4 subgroups (4 is the smallest subgroup size WGSL allows).
var<workgroup> red: array<vec4<f32>, 512>;
// The norm's sums of squares, [subgroup][token].
var<workgroup> red_ss: array<f32, 512>;
// Bit i set: invocation i leads its subgroup (WG <= 128).
var<workgroup> leaders: array<atomic<u32>, 4>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row0 = (wid.y * nwg.x + wid.x) * NR;
    let kq = p.k / 4u;
    if (lid < 4u) {
        atomicStore(&leaders[lid], 0u);
    }
    workgroupBarrier();
    // One invocation per subgroup (the lowest active one) leads it.
    let first = subgroupBroadcastFirst(lid);
    let leader = first == lid;
    if (leader) {
        atomicOr(&leaders[lid / 32u], 1u << (lid % 32u));
    }
    workgroupBarrier();
    var slot = 0u;
    var count = 0u;
    for (var w = 0u; w < 4u; w++) {
        let m = atomicLoad(&leaders[w]);
        count += countOneBits(m);
        if (w < first / 32u) {
            slot += countOneBits(m);
        } else if (w == first / 32u) {
            slot += countOneBits(m & ((1u << (first % 32u)) - 1u));
        }
    }
    // Rows past the end read row 0 again (always present) and are never written.
    let rb0 = row0 * p.row_bytes;
    let rb1 = select(0u, rb0 + p.row_bytes, row0 + 1u < p.n);
    let rb2 = select(0u, rb0 + 2u * p.row_bytes, row0 + 2u < p.n);
    let rb3 = select(0u, rb0 + 3u * p.row_bytes, row0 + 3u < p.n);
    for (var t0 = 0u; t0 < step.t; t0 += NT) {
        let nt = min(step.t - t0, NT);
        var acc: array<vec4<f32>, MAX_T>;
        var ss: array<f32, MAX_T>;
        for (var b = 0u; b < NT; b++) {
            acc[b] = vec4<f32>(0.0);
            ss[b] = 0.0;
        }
        if (row0 < p.n) {
            var xv: array<vec4<f32>, 8>;
            for (var u = lid; u < p.k / 32u; u += WG) {
                let e = u * 32u;
                for (var b = 0u; b < NT; b++) {
                    if (b >= nt) {
                        break;
                    }
                    ss[b] += load_x((t0 + b) * kq + u * 8u, u * 8u, &xv);
                    acc[b] += vec4<f32>(dot32(rb0, e, &xv), dot32(rb1, e, &xv), dot32(rb2, e, &xv), dot32(rb3, e, &xv));
                }
            }
        }
        for (var b = 0u; b < NT; b++) {
            if (b >= nt) {
                break;
            }
            let v = subgroupAdd(acc[b]);
            var sq = 0.0;
            if (NORM) {
                sq = subgroupAdd(ss[b]);
            }
            if (leader) {
                red[slot * MAX_T + b] = v;
                red_ss[slot * MAX_T + b] = sq;
            }
        }
        workgroupBarrier();
        if (lid < nt && row0 < p.n) {
            var total = vec4<f32>(0.0);
            var sq = 0.0;
            for (var i = 0u; i < count; i++) {
                total += red[i * MAX_T + lid];
                sq += red_ss[i * MAX_T + lid];
            }
            total *= norm_scale(sq);
            for (var r = 0u; r < NR; r++) {
                let row = row0 + r;
                if (row < p.n) {
                    if (GLU) {
                        if ((r & 1u) == 0u) {
                            put_glu(t0 + lid, p.out_off + row, total[r], total[r + 1u]);
                        }
                    } else {
                        put(t0 + lid, p.out_off + row, total[r]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
}

// The row-group reduction of the shared-memory matvecs (matvec, matvec_q8; prepended to each,
// which declare LANES and NR; NORM and norm_scale are mat_out.wgsl's): per token, each
// thread's partial sums of its NR rows (with NORM also its sum of squares of x) go to
// workgroup memory, then thread r of each group of LANES threads adds the group's partials for
// row row0 + r and writes it through mat_out.wgsl.

var<workgroup> red: array<f32, 1280>; // [NR + 1][256]: rows, then the norm's sums of squares

// Token t's sums: `a` this thread's partials of rows row0 .. row0 + 3, `ss` its sum of squares.
// Every thread of the workgroup calls it (it has barriers).
fn reduce_put(lid: u32, row0: u32, t: u32, a: vec4<f32>, ss: f32) {
    let g = lid / LANES;
    let lane = lid % LANES;
    let row = row0 + lane;
    red[lid] = a.x;
    red[256u + lid] = a.y;
    red[512u + lid] = a.z;
    red[768u + lid] = a.w;
    if (NORM) {
        red[1024u + lid] = ss;
    }
    workgroupBarrier();
    if (lane < NR && row < p.n) {
        let base = lane * 256u + g * LANES;
        var total = 0.0;
        var sq = 0.0;
        for (var i = 0u; i < LANES; i++) {
            total += red[base + i];
            if (NORM) {
                sq += red[1024u + g * LANES + i];
            }
        }
        let r = norm_scale(sq);
        total *= r;
        if (GLU) {
            if ((lane & 1u) == 0u) {
                var up = 0.0;
                for (var i = 0u; i < LANES; i++) {
                    up += red[base + 256u + i];
                }
                put_glu(t, p.out_off + row, total, up * r);
            }
        } else {
            put(t, p.out_off + row, total);
        }
    }
    workgroupBarrier();
}

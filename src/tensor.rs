//! A weight on the host, in a GPU-ready layout (shared by the native loader and the web).

use crate::quant::{self, GgmlType};
use std::borrow::Cow;

/// `rows` rows of `cols` elements of `ty`, in llama.cpp's block layout.
pub struct HostTensor<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [u8]>,
}

impl HostTensor<'_> {
    /// All elements as f32 (used for the small norm vectors).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.rows * self.cols);
        quant::dequantize_row(self.ty, &self.data, &mut v);
        v
    }
}

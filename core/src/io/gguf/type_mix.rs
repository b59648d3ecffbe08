//! The ggml type of each tensor in an exported GGUF: llama.cpp's quantizer's choice for the
//! same file type (`llama_tensor_get_type` in llama-quant.cpp, the llama.cpp vendored by
//! llama-cpp-python 0.3.36), so napkin's Q4_K_M of a model is typed tensor by tensor as
//! llama.cpp's own Q4_K_M of it (checked against its quantizer: `tests/corpus/ggml`).
//!
//! For a Llama-family model without experts, the rules that apply are:
//! - 1-D tensors (norms, biases, `rope_freqs`) stay f32; every 2-D weight starts at the file
//!   type's base type (Q4_K for Q4_K_S/M, Q5_K for Q5_K_S/M, ...).
//! - The head (`output.weight`, or `token_embd.weight` when tied) gets Q6_K, unless the base
//!   is Q8_0 (kept) or its rows are not whole base blocks (Q8_0).
//! - `attn_v` (or Phi-3's fused `attn_qkv`) of layer i: Q6_K in Q4_K_M and Q5_K_M when i uses more bits (the first and last
//!   eighth of the layers and every third between), Q5_K in Q4_K_S for i < 4.
//! - `ffn_down` of layer i: Q6_K in Q4_K_M and Q5_K_M when i uses more bits, Q5_K in Q4_K_S in
//!   the first eighth.
//! - A row that is not whole blocks of the chosen type falls back: Q4_K → Q5_0, Q5_K → Q5_1,
//!   Q6_K → Q8_0, then f16 if that does not fit either.

use super::dequant::GgmlType;
use super::export::GgufQuant;

/// What the rules need to know of a tensor, from its GGUF name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Head,
    Embedding,
    Values(usize),
    Down(usize),
    Other,
}

impl Role {
    fn of(name: &str, tied: bool) -> Role {
        let layer = || {
            name.strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|n| n.parse().ok())
        };
        match name {
            "output.weight" => Role::Head,
            "token_embd.weight" if tied => Role::Head,
            "token_embd.weight" => Role::Embedding,
            // llama.cpp counts Phi-3's fused `attn_qkv` as an `attn_v` (`category_is_attn_v`).
            _ if name.ends_with(".attn_v.weight") || name.ends_with(".attn_qkv.weight") => {
                layer().map_or(Role::Other, Role::Values)
            }
            _ if name.ends_with(".ffn_down.weight") => layer().map_or(Role::Other, Role::Down),
            _ => Role::Other,
        }
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third one
/// between.
fn uses_more_bits(layer: usize, layers: usize) -> bool {
    let (i, n) = (layer as i64, layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Whether rows of `cols` values are whole blocks of `ty`.
fn fits(ty: GgmlType, cols: usize) -> bool {
    ty.block()
        .is_some_and(|(per, _)| cols.is_multiple_of(per as usize))
}

/// llama.cpp's `tensor_type_fallback` for a row that is not whole blocks of `ty`.
fn fall_back(ty: GgmlType, cols: usize) -> GgmlType {
    if fits(ty, cols) {
        return ty;
    }
    let next = match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        other => other,
    };
    if fits(next, cols) {
        next
    } else {
        GgmlType::F16
    }
}

/// The type of the tensor `name` of `shape` (GGUF order: `[rows, cols]` as napkin holds it) in
/// a `quant` file of a model with `layers` decoder blocks, `tied` when it has no
/// `output.weight`.
pub fn tensor_type(
    quant: GgufQuant,
    name: &str,
    shape: &[usize],
    layers: usize,
    tied: bool,
) -> GgmlType {
    let &[_, cols] = shape else {
        return GgmlType::F32;
    };
    let base = quant.base_type();
    if matches!(base, GgmlType::F32 | GgmlType::F16) {
        return base;
    }
    use GgufQuant as Q;
    let chosen = match Role::of(name, tied) {
        Role::Head if !fits(base, cols) => GgmlType::Q8_0,
        Role::Head if base == GgmlType::Q8_0 => base,
        Role::Head => GgmlType::Q6K,
        Role::Values(i) => match quant {
            Q::Q4KM | Q::Q5KM if uses_more_bits(i, layers) => GgmlType::Q6K,
            Q::Q4KS if i < 4 => GgmlType::Q5K,
            _ => base,
        },
        Role::Down(i) => match quant {
            Q::Q4KM | Q::Q5KM if uses_more_bits(i, layers) => GgmlType::Q6K,
            Q::Q4KS if i < layers / 8 => GgmlType::Q5K,
            _ => base,
        },
        Role::Embedding | Role::Other => base,
    };
    fall_back(chosen, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's pattern for 32 layers (its comments: 0-3, 28-31 and every third between).
    #[test]
    fn more_bits_go_to_the_ends_and_every_third_layer() {
        let chosen: Vec<usize> = (0..32).filter(|&i| uses_more_bits(i, 32)).collect();
        assert_eq!(
            chosen,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn rows_that_are_not_whole_blocks_fall_back_as_llama_cpp_does() {
        assert_eq!(fall_back(GgmlType::Q4K, 576), GgmlType::Q5_0);
        assert_eq!(fall_back(GgmlType::Q5K, 576), GgmlType::Q5_1);
        assert_eq!(fall_back(GgmlType::Q6K, 576), GgmlType::Q8_0);
        assert_eq!(fall_back(GgmlType::Q4K, 688), GgmlType::F16);
        assert_eq!(fall_back(GgmlType::Q8_0, 96), GgmlType::Q8_0);
        assert_eq!(fall_back(GgmlType::Q8_0, 80), GgmlType::F16);
    }
}

//! The model's parameters under their Hugging Face names, for checkpoint writers, gradient
//! reports and tests. The order is the module order of `LlamaForCausalLM.named_parameters()`.

use burn::tensor::Tensor;

use super::linear::Linear;
use super::llama::Llama;
use crate::config::LoraTarget;
use crate::kernels::values::to_f32_vec;

/// A parameter tensor of rank 1 (norm gains, biases) or 2 (matrices).
#[derive(Debug, Clone)]
pub enum ParamTensor {
    /// `[D]`.
    Vector(Tensor<1>),
    /// `[rows, cols]`.
    Matrix(Tensor<2>),
}

impl ParamTensor {
    /// The shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            ParamTensor::Vector(t) => t.dims().to_vec(),
            ParamTensor::Matrix(t) => t.dims().to_vec(),
        }
    }

    /// The values, row-major, as f32.
    pub fn to_vec(&self) -> Vec<f32> {
        match self {
            ParamTensor::Vector(t) => to_f32_vec(t.clone()),
            ParamTensor::Matrix(t) => to_f32_vec(t.clone()),
        }
    }

    /// The gradient of this parameter in `grads`, if it has one.
    pub fn grad(&self, grads: &burn::tensor::Gradients) -> Option<ParamTensor> {
        match self {
            ParamTensor::Vector(t) => t.grad(grads).map(ParamTensor::Vector),
            ParamTensor::Matrix(t) => t.grad(grads).map(ParamTensor::Matrix),
        }
    }
}

impl Llama {
    /// Every base parameter with its HF name (`model.layers.0.self_attn.q_proj.weight`, ...).
    /// A tied model has no `lm_head.weight` entry: its head is `model.embed_tokens.weight`.
    /// NF4 weights appear dequantized (transient copies, for export and comparison).
    pub fn hf_parameters(&self) -> Vec<(String, ParamTensor)> {
        self.config
            .hf_parameter_shapes()
            .into_iter()
            .filter_map(|(name, _)| self.hf_tensor(&name, false).map(|t| (name, t)))
            .collect()
    }

    /// One parameter by its Hugging Face name, made on its own (an NF4 linear is dequantized
    /// alone): with `merge_lora`, a linear with an adapter is `W + s·B·A`. `None` for a name
    /// the model does not have. Writers use it to hold one tensor at a time.
    pub fn hf_tensor(&self, name: &str, merge_lora: bool) -> Option<ParamTensor> {
        use ParamTensor::{Matrix, Vector};
        let device = self.device();
        let linear_value = |linear: &Linear| {
            let weight = linear.dense_weight(&device);
            match (&linear.lora, merge_lora) {
                (Some(adapter), true) => adapter.merged_weight(weight),
                _ => weight,
            }
        };
        match name {
            "model.embed_tokens.weight" => {
                let table = self.embed_tokens.val();
                return Some(Matrix(match (&self.embed_lora, merge_lora) {
                    (Some(lora), true) => table + lora.delta_weight(),
                    _ => table,
                }));
            }
            "model.norm.weight" => return Some(Vector(self.norm.weight.val())),
            "lm_head.weight" => return self.lm_head.as_ref().map(|h| Matrix(linear_value(h))),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let block = self.layers.get(layer.parse::<usize>().ok()?)?;
        if let Some(module) = rest.strip_suffix(".bias") {
            let bias = block_linear(block, module)?.bias.as_ref()?;
            return Some(Vector(bias.val()));
        }
        match rest.strip_suffix(".weight")? {
            "input_layernorm" => Some(Vector(block.input_layernorm.weight.val())),
            "post_attention_layernorm" => Some(Vector(block.post_attention_layernorm.weight.val())),
            "self_attn.q_norm" => Some(Vector(block.self_attn.q_norm.as_ref()?.weight.val())),
            "self_attn.k_norm" => Some(Vector(block.self_attn.k_norm.as_ref()?.weight.val())),
            module => Some(Matrix(linear_value(block_linear(block, module)?))),
        }
    }
}

impl Llama {
    /// One tensor as the checkpoint stores it (`LlamaConfig::stored_parameter_shapes`): a
    /// fused one (Phi-3's `qkv_proj`, `gate_up_proj`) made of its parts' rows, anything else as
    /// [`Llama::hf_tensor`] makes it. `None` for a name the model does not have.
    pub fn stored_tensor(&self, name: &str, merge_lora: bool) -> Option<ParamTensor> {
        let parts = self.config.stored_parts(name);
        if let [only] = parts.as_slice() {
            return self.hf_tensor(only, merge_lora);
        }
        let mut matrices = Vec::with_capacity(parts.len());
        for part in &parts {
            match self.hf_tensor(part, merge_lora)? {
                ParamTensor::Matrix(m) => matrices.push(m),
                ParamTensor::Vector(_) => return None,
            }
        }
        Some(ParamTensor::Matrix(Tensor::cat(matrices, 0)))
    }
}

/// A block's linear by its HF module path within the block (`self_attn.q_proj`, ...).
fn block_linear<'a>(block: &'a super::block::DecoderBlock, module: &str) -> Option<&'a Linear> {
    let (a, m) = (&block.self_attn, &block.mlp);
    Some(match module {
        "self_attn.q_proj" => &a.q_proj,
        "self_attn.k_proj" => &a.k_proj,
        "self_attn.v_proj" => &a.v_proj,
        "self_attn.o_proj" => &a.o_proj,
        "mlp.gate_proj" => &m.gate_proj,
        "mlp.up_proj" => &m.up_proj,
        "mlp.down_proj" => &m.down_proj,
        _ => return None,
    })
}

/// A decoder-block linear layer with its HF module path (`model.layers.3.self_attn.q_proj`).
pub struct NamedLinear<L> {
    /// HF module path.
    pub path: String,
    /// Block index.
    pub layer: usize,
    /// Which of the seven it is.
    pub target: LoraTarget,
    /// The layer.
    pub linear: L,
}

impl Llama {
    /// The seven linears of every block, in module order.
    pub fn block_linears(&self) -> Vec<NamedLinear<&Linear>> {
        let mut out = Vec::with_capacity(7 * self.layers.len());
        for (layer, block) in self.layers.iter().enumerate() {
            let a = &block.self_attn;
            let m = &block.mlp;
            let seven = [
                &a.q_proj,
                &a.k_proj,
                &a.v_proj,
                &a.o_proj,
                &m.gate_proj,
                &m.up_proj,
                &m.down_proj,
            ];
            for (target, linear) in LoraTarget::ALL.into_iter().zip(seven) {
                out.push(NamedLinear {
                    path: format!("model.layers.{layer}.{}", target.block_path()),
                    layer,
                    target,
                    linear,
                });
            }
        }
        out
    }

    /// The seven linears of every block, mutably, in module order.
    pub fn block_linears_mut(&mut self) -> Vec<NamedLinear<&mut Linear>> {
        let mut out = Vec::with_capacity(7 * self.layers.len());
        for (layer, block) in self.layers.iter_mut().enumerate() {
            for (target, linear) in LoraTarget::ALL.into_iter().zip(block.linears_mut()) {
                out.push(NamedLinear {
                    path: format!("model.layers.{layer}.{}", target.block_path()),
                    layer,
                    target,
                    linear,
                });
            }
        }
        out
    }
}

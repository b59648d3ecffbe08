//! A replay of PyTorch's autograd bookkeeping: what each op saves, and what the backward
//! allocates and frees, in bytes.
//!
//! The forward is written onto the tape op by op (see `llama.rs`). Each op records
//! - the tensors it saves for its backward, under PyTorch's rules (`derivatives.yaml`): a
//!   product saves each operand when the *other* one needs a gradient; `pow`, `silu`, `mm`'s
//!   input save their input; `rsqrt`, `softmax`, `log_softmax` save their result; additions,
//!   casts, views, concatenations and products with a Python scalar save nothing;
//! - the values whose gradient it produces, and the parameters it accumulates a `.grad` into.
//!
//! A *storage* is one allocation (views share it); a *value* is one autograd input (a view is
//! its own value but no bytes). A saved storage is counted once however many ops save it,
//! under the decoder layer that saves it first.
//!
//! The backward then runs the tape in reverse, as PyTorch's engine does on one device: each
//! op allocates the gradients of its tracked inputs, a second gradient arriving for the same
//! value is summed into a new buffer, a `.grad` is allocated on its first arrival and kept,
//! and a saved storage is freed after the last op that saves it has run. The highest point of
//! that walk is the step's peak above the weights.

use std::collections::{BTreeMap, BTreeSet};

/// Where a saved tensor is counted: a decoder layer, or outside the layers.
pub type Layer = Option<usize>;

/// One value in the replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Val {
    /// The allocation that holds it.
    pub storage: usize,
    /// Autograd's identity of this value (views of one storage differ).
    pub value: usize,
    /// Bytes of this value (its gradient has the same size).
    pub bytes: u64,
    /// Whether a gradient flows to it.
    pub tracked: bool,
}

/// A parameter (kept by reference: saving it costs nothing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    /// An identity, so tied weights share one `.grad`.
    pub id: usize,
    /// Bytes of the parameter (its `.grad` has the same size).
    pub bytes: u64,
    /// `requires_grad`.
    pub trainable: bool,
}

/// How an op hands the gradient back to one input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum GradRule {
    /// A new buffer of the input's size (most ops).
    Allocates,
    /// The output's gradient itself (additions, views): no bytes.
    PassesThrough,
}

#[derive(Debug, Clone)]
struct Op {
    /// The values whose gradient this op's backward produces, and how.
    inputs: Vec<(Val, GradRule)>,
    /// Parameters this op accumulates into.
    params: Vec<Param>,
    /// The op's outputs (their gradients are consumed by this op's backward).
    outputs: Vec<Val>,
    /// Storages this op saves.
    saved: Vec<usize>,
    /// Bytes the backward holds for a moment beyond the input gradients (a broadcast product's
    /// full-size gradient before it is summed down, a score gradient inside attention).
    scratch: u64,
    /// A checkpointed block's rerun (its forward op's index in `reruns`).
    rerun: Option<usize>,
}

/// A checkpointed block as its backward reruns it, recorded on a tape of its own: the rerun's
/// input (a detached view of the block's input) and its output.
#[derive(Debug)]
pub struct Rerun {
    pub tape: Tape,
    pub input: Val,
    pub output: Val,
}

/// The forward as recorded.
#[derive(Debug, Default)]
pub struct Tape {
    pub(super) storage_bytes: Vec<u64>,
    values: usize,
    ops: Vec<Op>,
    /// The layer that saved each storage first.
    pub(super) saved_by: BTreeMap<usize, Layer>,
    layer: Layer,
    /// Storages the caller holds after the forward (the logits, the loss).
    pub(super) retained: BTreeSet<usize>,
    /// The forward's allocation order: ops begun so far, the op each storage was made by,
    /// the last op that read each storage, and bytes an op holds only while it runs.
    pub(super) ops_begun: usize,
    pub(super) made_by: Vec<usize>,
    pub(super) last_read: Vec<Option<usize>>,
    pub(super) forward_scratch: BTreeMap<usize, u64>,
    /// Storages made before the step (the token ids the caller holds).
    pub(super) external: BTreeSet<usize>,
    /// Checkpointed blocks by the index of the op that ran them.
    pub(super) reruns: BTreeMap<usize, Rerun>,
}

impl Tape {
    /// Sets the layer the next saved tensors are counted under.
    pub fn enter(&mut self, layer: Layer) {
        self.layer = layer;
    }

    /// A new tensor of `bytes`, produced by an op that needs no gradient bookkeeping of its own
    /// (an input, a table, a mask).
    pub fn input(&mut self, bytes: u64, tracked: bool) -> Val {
        self.begin(&[]);
        self.output(bytes, tracked)
    }

    /// A tensor made before the step and held by someone else (the token ids the caller
    /// holds; a rerun's views of what its checkpoint kept).
    pub fn external(&mut self, bytes: u64, tracked: bool) -> Val {
        let x = self.input(bytes, tracked);
        self.external.insert(x.storage);
        x
    }

    /// Begins an op that reads `inputs` (its outputs follow with `output`).
    fn begin(&mut self, inputs: &[Val]) {
        for v in inputs {
            self.last_read[v.storage] = Some(self.ops_begun);
        }
        self.ops_begun += 1;
    }

    /// Bytes the op just begun holds while it runs, beside its outputs (bitsandbytes'
    /// dequantized weight).
    fn forward_scratch(&mut self, bytes: u64) {
        *self.forward_scratch.entry(self.ops_begun - 1).or_insert(0) += bytes;
    }

    /// A new storage of `bytes`, made by the op begun last.
    fn output(&mut self, bytes: u64, tracked: bool) -> Val {
        let storage = self.storage_bytes.len();
        self.storage_bytes.push(bytes);
        self.made_by.push(self.ops_begun - 1);
        self.last_read.push(None);
        self.values += 1;
        Val {
            storage,
            value: self.values - 1,
            bytes,
            tracked,
        }
    }

    /// `embedding(ids, table)`: saves the ids when the table trains, whose backward scatters the
    /// output's gradient into a dense `.grad` of the table. `hooked`: the output is made to need
    /// a gradient (`enable_input_require_grads`) even when the table is frozen.
    pub fn embedding(&mut self, ids: Val, table: Param, out_bytes: u64, hooked: bool) -> Val {
        self.begin(&[ids]);
        let out = self.output(out_bytes, table.trainable || hooked);
        if table.trainable {
            self.record(vec![], vec![table], vec![out], vec![ids.storage], 0);
        }
        out
    }

    /// A view of `x` with the same bytes (reshape, transpose, unsqueeze): no storage, and its
    /// gradient is a view of the output's.
    pub fn view(&mut self, x: Val) -> Val {
        self.values += 1;
        let out = Val {
            value: self.values - 1,
            ..x
        };
        if x.tracked {
            self.record(
                vec![(x, GradRule::PassesThrough)],
                vec![],
                vec![out],
                vec![],
                0,
            );
        }
        out
    }

    /// A view of part of `x` (a slice): no storage, but its backward writes the gradient into a
    /// zero tensor of `x`'s size.
    pub fn slice(&mut self, x: Val, bytes: u64) -> Val {
        self.values += 1;
        let out = Val {
            value: self.values - 1,
            bytes,
            ..x
        };
        if x.tracked {
            self.record(vec![(x, GradRule::Allocates)], vec![], vec![out], vec![], 0);
        }
        out
    }

    /// An op that writes a new tensor of `bytes` from `inputs` and saves nothing: a cast, a
    /// copy, negation, a product with a Python scalar, a concatenation (whose backward only
    /// slices), a row reduction.
    pub fn fresh(&mut self, inputs: &[Val], bytes: u64, rule: FreshGrad) -> Val {
        let tracked = inputs.iter().any(|v| v.tracked);
        self.begin(inputs);
        let out = self.output(bytes, tracked);
        if tracked {
            let grad = match rule {
                FreshGrad::Allocates => GradRule::Allocates,
                FreshGrad::PassesThrough => GradRule::PassesThrough,
            };
            let ins = inputs
                .iter()
                .filter(|v| v.tracked)
                .map(|&v| (v, grad))
                .collect();
            self.record(ins, vec![], vec![out], vec![], 0);
        }
        out
    }

    /// `a + b` (with broadcasting of `b` allowed): saves nothing, both get the output's
    /// gradient (a broadcast operand's is summed down into a new buffer).
    pub fn add(&mut self, a: Val, b: Val) -> Val {
        self.begin(&[a, b]);
        let out = self.output(a.bytes.max(b.bytes), a.tracked || b.tracked);
        let ins = [a, b]
            .into_iter()
            .filter(|v| v.tracked)
            .map(|v| {
                let rule = if v.bytes == out.bytes {
                    GradRule::PassesThrough
                } else {
                    GradRule::Allocates
                };
                (v, rule)
            })
            .collect::<Vec<_>>();
        if out.tracked {
            self.record(ins, vec![], vec![out], vec![], 0);
        }
        out
    }

    /// `a * b` (element-wise, `b` may broadcast): saves `a` if `b` needs a gradient and `b` if
    /// `a` does. A broadcast operand's gradient is the full-size product summed down.
    pub fn mul(&mut self, a: Val, b: Val) -> Val {
        let bytes = a.bytes.max(b.bytes);
        let broadcast = [a, b].iter().any(|v| v.tracked && v.bytes < bytes);
        self.product(a, b, bytes, if broadcast { bytes } else { 0 })
    }

    /// `x * w` with a parameter `w` (a norm's weight): saves `x` if `w` trains.
    pub fn mul_param(&mut self, x: Val, w: Param) -> Val {
        self.begin(&[x]);
        let out = self.output(x.bytes, x.tracked || w.trainable);
        self.product_with_param(x, w, out, 0);
        out
    }

    /// `x · Wᵀ` (`F.linear`, `mm`): saves `x` if `W` trains; the output has `out_bytes`.
    pub fn linear(&mut self, x: Val, w: Param, out_bytes: u64) -> Val {
        self.begin(&[x]);
        let out = self.output(out_bytes, x.tracked || w.trainable);
        self.product_with_param(x, w, out, 0);
        out
    }

    fn product_with_param(&mut self, x: Val, w: Param, out: Val, scratch: u64) {
        if !out.tracked {
            return;
        }
        let saved = if w.trainable { vec![x.storage] } else { vec![] };
        let ins = if x.tracked {
            vec![(x, GradRule::Allocates)]
        } else {
            vec![]
        };
        let params = if w.trainable { vec![w] } else { vec![] };
        self.record(ins, params, vec![out], saved, scratch);
    }

    /// A batched product `a @ b` of two tensors: the same saving rule as `mul`.
    pub fn matmul(&mut self, a: Val, b: Val, out_bytes: u64) -> Val {
        self.product(a, b, out_bytes, 0)
    }

    /// A product of two tensors: each operand is saved when the other needs a gradient.
    fn product(&mut self, a: Val, b: Val, out_bytes: u64, scratch: u64) -> Val {
        self.begin(&[a, b]);
        let out = self.output(out_bytes, a.tracked || b.tracked);
        if out.tracked {
            let mut saved = vec![];
            if b.tracked {
                saved.push(a.storage);
            }
            if a.tracked {
                saved.push(b.storage);
            }
            let ins = [a, b]
                .into_iter()
                .filter(|v| v.tracked)
                .map(|v| (v, GradRule::Allocates))
                .collect();
            self.record(ins, vec![], vec![out], saved, scratch);
        }
        out
    }

    /// A one-input op that saves its input when it needs a gradient (`pow`, `silu`).
    pub fn saves_input(&mut self, x: Val, out_bytes: u64) -> Val {
        self.unary(x, out_bytes, false)
    }

    /// A one-input op that saves its result (`rsqrt`, `softmax`, `log_softmax`).
    pub fn saves_output(&mut self, x: Val, out_bytes: u64) -> Val {
        self.unary(x, out_bytes, true)
    }

    fn unary(&mut self, x: Val, out_bytes: u64, saves_output: bool) -> Val {
        self.begin(&[x]);
        let out = self.output(out_bytes, x.tracked);
        if x.tracked {
            let saved = if saves_output { out.storage } else { x.storage };
            self.record(
                vec![(x, GradRule::Allocates)],
                vec![],
                vec![out],
                vec![saved],
                0,
            );
        }
        out
    }

    /// A custom op with explicit bookkeeping: `outputs` of the given bytes, `saved` storages
    /// (its own outputs may be among them, by index into `outputs`), `scratch` bytes held during
    /// its backward. Used for fused kernels (attention, the loss, dropout, bitsandbytes).
    pub fn custom(&mut self, spec: CustomOp<'_>) -> Vec<Val> {
        let tracked = spec.inputs.iter().any(|v| v.tracked);
        let reads: Vec<Val> = spec
            .inputs
            .iter()
            .chain(spec.saved_extra)
            .copied()
            .collect();
        self.begin(&reads);
        if spec.forward_scratch > 0 {
            self.forward_scratch(spec.forward_scratch);
        }
        let outputs: Vec<Val> = spec
            .outputs
            .iter()
            .map(|&bytes| self.output(bytes, tracked))
            .collect();
        if tracked {
            let mut saved: Vec<usize> = spec.saved_inputs.iter().map(|v| v.storage).collect();
            saved.extend(spec.saved_outputs.iter().map(|&i| outputs[i].storage));
            saved.extend(spec.saved_extra.iter().map(|v| v.storage));
            let ins = spec
                .inputs
                .iter()
                .filter(|v| v.tracked)
                .map(|&v| (v, GradRule::Allocates))
                .collect();
            self.record(ins, vec![], outputs.clone(), saved, spec.scratch);
        }
        outputs
    }

    /// A checkpointed block: its forward keeps only the input `x`; its backward reruns the block
    /// with gradients on, which holds `recompute_peak` bytes for a moment (the block's saved
    /// tensors and its own backward), and accumulates into the block's trainable `params`.
    /// Under the reentrant variant the output needs a gradient only if `x` does.
    /// `kept`: what else the checkpoint holds until its backward (the arguments its closure
    /// captured, the RNG state it restores before the rerun).
    pub fn checkpoint(
        &mut self,
        x: Val,
        kept: &[Val],
        out_bytes: u64,
        params: Vec<Param>,
        recompute_peak: u64,
        rerun: Rerun,
    ) -> Val {
        let reads: Vec<Val> = [x].iter().chain(kept).copied().collect();
        self.begin(&reads);
        let op = self.ops_begun - 1;
        self.reruns.insert(op, rerun);
        let out = self.output(out_bytes, x.tracked);
        if x.tracked {
            let mut saved = vec![x.storage];
            saved.extend(kept.iter().map(|v| v.storage));
            self.record(
                vec![(x, GradRule::Allocates)],
                params,
                vec![out],
                saved,
                recompute_peak,
            );
            self.ops.last_mut().expect("just recorded").rerun = Some(op);
        }
        out
    }

    /// An op that only reads `inputs` and makes nothing autograd sees (a metric taken with
    /// `.item()`): it keeps them alive in the forward until it runs.
    pub fn read(&mut self, inputs: &[Val]) {
        self.begin(inputs);
    }

    /// Whether some op saves `x`'s storage.
    pub fn saves(&self, x: Val) -> bool {
        self.saved_by.contains_key(&x.storage)
    }

    /// The trainable parameters recorded so far.
    pub fn trainable_params(&self) -> Vec<Param> {
        let mut seen = BTreeSet::new();
        self.ops
            .iter()
            .flat_map(|op| op.params.iter().copied())
            .filter(|p| seen.insert(p.id))
            .collect()
    }

    /// Marks a storage the caller holds after the forward.
    pub fn retain(&mut self, x: Val) {
        self.retained.insert(x.storage);
    }

    fn record(
        &mut self,
        inputs: Vec<(Val, GradRule)>,
        params: Vec<Param>,
        outputs: Vec<Val>,
        saved: Vec<usize>,
        scratch: u64,
    ) {
        for &storage in &saved {
            self.saved_by.entry(storage).or_insert(self.layer);
        }
        self.ops.push(Op {
            inputs,
            params,
            outputs,
            saved,
            scratch,
            rerun: None,
        });
    }

    /// Saved bytes per layer (index `None`: outside the layers).
    pub fn saved_per_layer(&self) -> BTreeMap<Layer, u64> {
        let mut per = BTreeMap::new();
        for (&storage, &layer) in &self.saved_by {
            *per.entry(layer).or_insert(0) += self.storage_bytes[storage];
        }
        per
    }

    /// What the forward leaves allocated: every saved storage and the retained outputs.
    pub fn alive_after_forward(&self) -> u64 {
        let alive: BTreeSet<usize> = self
            .saved_by
            .keys()
            .chain(self.retained.iter())
            .copied()
            .collect();
        alive.iter().map(|&s| self.storage_bytes[s]).sum()
    }

    /// The backward walk from a loss `loss`: the highest allocation above the weights, the
    /// trainable parameters' gradients included.
    pub fn backward_peak(&self, loss: Val) -> u64 {
        let mut live = self.alive_after_forward();
        let mut peak = live;
        self.backward_from(loss, false, &mut |event| match event {
            Allocation::Malloc { bytes, .. } => {
                live += bytes;
                peak = peak.max(live);
            }
            Allocation::Free { bytes, .. } => live -= bytes,
        });
        peak
    }

    /// The backward from `loss`, as PyTorch's engine runs it on one device, told as the
    /// allocations and frees it makes: gradient buffers (ids after the storages'), the frees of
    /// saved storages (their storage index as id), `.grad`s, and each op's scratch. Without
    /// `expand_reruns` a checkpointed block's rerun is one scratch block of its peak (as the
    /// peak counts it); with it, the rerun is told tensor by tensor (its forward with
    /// gradients, then its own backward) and storages made before the step are never freed.
    pub(super) fn backward_from(
        &self,
        loss: Val,
        expand_reruns: bool,
        emit: &mut dyn FnMut(Allocation),
    ) {
        let mut walk = Walk {
            next_id: self.storage_bytes.len(),
            param_grads: BTreeSet::new(),
            expand_reruns,
            emit,
        };
        let loss_grad = walk.malloc(loss.bytes);
        self.walk_back(0, loss, loss_grad, None, &mut walk);
    }

    /// Runs the ops backward from `loss`, whose gradient is the buffer `loss_grad` (owned by
    /// this walk when `keep` is `None`, by the caller's walk otherwise); storage `s` has id
    /// `base + s`. Returns the buffer left holding the gradient of `keep`, not freed.
    fn walk_back(
        &self,
        base: usize,
        loss: Val,
        loss_grad: usize,
        keep: Option<Val>,
        walk: &mut Walk<'_>,
    ) -> Option<Buffer> {
        // Ops still to run that save each storage.
        let mut pending: BTreeMap<usize, usize> = BTreeMap::new();
        for op in &self.ops {
            for &s in &op.saved {
                *pending.entry(s).or_insert(0) += 1;
            }
        }
        // Gradient buffers: value → buffer; a buffer shared by pass-through is freed when its
        // last holder is consumed. A rerun's incoming gradient belongs to the outer walk (one
        // more holder, so this walk never frees it).
        let mut grad_of: BTreeMap<usize, usize> = BTreeMap::new();
        let mut buffers: Vec<Buffer> = vec![Buffer {
            id: loss_grad,
            bytes: loss.bytes,
            holders: if keep.is_some() { 2 } else { 1 },
        }];
        grad_of.insert(loss.value, 0);

        for op in self.ops.iter().rev() {
            let outputs_with_grad: Vec<usize> = op
                .outputs
                .iter()
                .filter_map(|o| grad_of.get(&o.value).copied())
                .collect();
            if outputs_with_grad.is_empty() {
                // Nothing reached this op (its output was not used by the loss).
                for &s in &op.saved {
                    self.release_saved(base, &mut pending, s, walk);
                }
                continue;
            }
            let incoming = outputs_with_grad[0];
            let rerun = op
                .rerun
                .filter(|_| walk.expand_reruns)
                .map(|key| &self.reruns[&key]);
            // The rerun's gradient for the block's input, made by its own backward.
            let mut rerun_input_grad = None;
            let scratch = match rerun {
                Some(rerun) => {
                    rerun_input_grad = rerun.replay(buffers[incoming].id, walk);
                    None
                }
                None => (op.scratch > 0).then(|| walk.malloc(op.scratch)),
            };
            for &(input, rule) in &op.inputs {
                let buffer = match (rule, rerun) {
                    (GradRule::PassesThrough, _) => {
                        buffers[incoming].holders += 1;
                        incoming
                    }
                    (GradRule::Allocates, Some(_)) => match rerun_input_grad.take() {
                        // Passed straight through the block: the incoming buffer itself.
                        Some(made) if made.id == buffers[incoming].id => {
                            buffers[incoming].holders += 1;
                            incoming
                        }
                        Some(made) => {
                            buffers.push(Buffer { holders: 1, ..made });
                            buffers.len() - 1
                        }
                        None => continue,
                    },
                    (GradRule::Allocates, None) => {
                        let id = walk.malloc(input.bytes);
                        buffers.push(Buffer {
                            id,
                            bytes: input.bytes,
                            holders: 1,
                        });
                        buffers.len() - 1
                    }
                };
                if let Some(&old) = grad_of.get(&input.value) {
                    // A second gradient: `old + new` into a fresh buffer, both released.
                    let id = walk.malloc(input.bytes);
                    buffers.push(Buffer {
                        id,
                        bytes: input.bytes,
                        holders: 1,
                    });
                    for b in [old, buffer] {
                        Self::release_buffer(&mut buffers, b, walk);
                    }
                    grad_of.insert(input.value, buffers.len() - 1);
                } else {
                    grad_of.insert(input.value, buffer);
                }
            }
            // A rerun's own backward accumulated into its block's parameters.
            if rerun.is_none() {
                for p in &op.params {
                    walk.accumulate(*p);
                }
            }
            if let Some(id) = scratch {
                walk.free(id, op.scratch);
            }
            for &s in &op.saved {
                self.release_saved(base, &mut pending, s, walk);
            }
            for o in &op.outputs {
                if let Some(b) = grad_of.remove(&o.value) {
                    Self::release_buffer(&mut buffers, b, walk);
                }
            }
        }
        keep.and_then(|v| grad_of.get(&v.value).map(|&b| buffers[b]))
    }

    fn release_saved(
        &self,
        base: usize,
        pending: &mut BTreeMap<usize, usize>,
        storage: usize,
        walk: &mut Walk<'_>,
    ) {
        if let Some(count) = pending.get_mut(&storage) {
            *count -= 1;
            if *count == 0 {
                pending.remove(&storage);
                let held_elsewhere = walk.expand_reruns && self.external.contains(&storage);
                if !self.retained.contains(&storage) && !held_elsewhere {
                    walk.free(base + storage, self.storage_bytes[storage]);
                }
            }
        }
    }

    fn release_buffer(buffers: &mut [Buffer], buffer: usize, walk: &mut Walk<'_>) {
        let entry = &mut buffers[buffer];
        entry.holders -= 1;
        if entry.holders == 0 {
            walk.free(entry.id, entry.bytes);
        }
    }
}

impl Rerun {
    /// The rerun inside the outer walk: its forward with gradients on (the block's input and
    /// what the checkpoint kept are views, not new tensors), its backward from `incoming` (the
    /// outer gradient of its output), then its output is dropped. Returns the gradient it made
    /// for the block's input.
    fn replay(&self, incoming: usize, walk: &mut Walk<'_>) -> Option<Buffer> {
        let base = walk.next_id;
        walk.next_id += self.tape.storage_bytes.len();
        let output = self.output.storage;
        self.tape
            .forward_allocations(base, true, &[output], None, walk.emit);
        let input_grad = self
            .tape
            .walk_back(base, self.output, incoming, Some(self.input), walk);
        walk.free(base + output, self.output.bytes);
        input_grad
    }
}

/// What one backward walk shares with the reruns it expands.
struct Walk<'e> {
    next_id: usize,
    /// Parameters whose `.grad` exists.
    param_grads: BTreeSet<usize>,
    expand_reruns: bool,
    emit: &'e mut dyn FnMut(Allocation),
}

impl Walk<'_> {
    fn malloc(&mut self, bytes: u64) -> usize {
        self.next_id += 1;
        (self.emit)(Allocation::Malloc {
            id: self.next_id - 1,
            bytes,
        });
        self.next_id - 1
    }

    fn free(&mut self, id: usize, bytes: u64) {
        (self.emit)(Allocation::Free { id, bytes });
    }

    /// A gradient for `p`: the first becomes `.grad`; a later one is summed in place.
    fn accumulate(&mut self, p: Param) {
        let id = self.malloc(p.bytes);
        if !self.param_grads.insert(p.id) {
            self.free(id, p.bytes);
        }
    }
}

/// A gradient buffer of the backward walk.
#[derive(Debug, Clone, Copy)]
pub(super) struct Buffer {
    id: usize,
    bytes: u64,
    /// Values whose gradient it is (pass-through ops share it).
    holders: usize,
}

/// One event of a step's allocation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// A new block of `bytes` under `id`.
    Malloc { id: usize, bytes: u64 },
    /// The block `id` (of `bytes`) is freed.
    Free { id: usize, bytes: u64 },
}

/// How a `fresh` op's backward hands the gradient to its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FreshGrad {
    /// A new buffer per input (casts, copies, scalar products, negation, reductions).
    Allocates,
    /// The output's gradient itself (a concatenation's slices are views of it).
    PassesThrough,
}

/// A custom op's bookkeeping (see [`Tape::custom`]).
#[derive(Debug, Default)]
pub struct CustomOp<'a> {
    /// Inputs (the tracked ones get a gradient of their size).
    pub inputs: &'a [Val],
    /// Bytes of each output.
    pub outputs: &'a [u64],
    /// Inputs it saves.
    pub saved_inputs: &'a [Val],
    /// Outputs it saves (indices into `outputs`).
    pub saved_outputs: &'a [usize],
    /// Other tensors it saves (a dropout mask made on the side).
    pub saved_extra: &'a [Val],
    /// Bytes its backward holds for a moment.
    pub scratch: u64,
    /// Bytes its forward holds while it runs (not kept).
    pub forward_scratch: u64,
}

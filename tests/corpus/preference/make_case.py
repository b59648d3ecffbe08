"""A tiny Llama with a LoRA adapter, eight preference pairs, and TRL's DPO and ORPO losses,
metrics and LoRA gradients on them: `preference.rs` holds napkin's preference step to these.

Writes, beside this script:
- `hf/`: the model (`LlamaForCausalLM`, f32, vocabulary of the shared fixtures' byte-level BPE
  tokenizer, copied in as `tokenizer.json`; norms drawn away from 1);
- `lora/`: a peft adapter (r 8, alpha 16, on q, v, o and down; A and B drawn N(0, 0.05^2) after
  `DPOTrainer` made it, so the policy differs from DPO's reference, the base with the adapter
  disabled, as for an adapter the trainer starts);
- `pairs.jsonl`: the pairs as plain text (`prompt`, `chosen`, `rejected`);
- `reference.safetensors` and `reference.json`:
  - `ids`: TRL's tokenization of each pair (`prompt_ids`, `chosen_ids`, `rejected_ids`; EOS
    appended to plain-text completions, as `DPOTrainer` does);
  - `dpo.*`: `DPOTrainer._compute_loss` (loss `sigmoid`, beta 0.1, the reference the same
    model with its adapter disabled) on all eight pairs in one batch: `loss` [1],
    `chosen_logps`, `rejected_logps`, `ref_chosen_logps`, `ref_rejected_logps` [8], the
    logged metrics, and `dpo.grad.<peft name>` for every LoRA tensor;
  - `orpo.*`: `ORPOTrainer.get_batch_loss_metrics` (beta = lambda 0.1) on the same token ids:
    `loss`, `nll` [1], `chosen_logps`, `rejected_logps` [8] (means over completion tokens),
    its metrics, and `orpo.grad.<peft name>`.

    .venv/bin/pip install trl==1.16.0 datasets==5.2.0 (beside scripts/reference/requirements.txt); then
    .venv/bin/python tests/corpus/preference/make_case.py NAPKIN_FIXTURES-or-../shared/fixtures
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
FIXTURES = Path(sys.argv[1] if len(sys.argv) > 1 else HERE / "../../../../shared/fixtures")
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)

PAIRS = [
    ("The capital of France is", " Paris.", " a cheese."),
    ("Two plus two equals", " four.", " seven, or so."),
    ("Water boils at", " one hundred degrees.", " noon"),
    ("A cat is a", " small animal that purrs.", " kind of car."),
    ("Say hello:", " Hello!", " No."),
    ("The opposite of hot is", " cold.", " hot."),
    ("Rust is a programming", " language.", " stain on a bike."),
    ("The sun rises in the", " east.", " basement, every Tuesday."),
]
BETA = 0.1


def make_model():
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = HERE / "hf"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "tokenizer" / "tokenizer.json", out / "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"),
                                        eos_token="<|endoftext|>", pad_token="<|pad|>")
    config = LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, initializer_range=0.05, bos_token_id=None,
                         eos_token_id=0, pad_token_id=1)
    torch.manual_seed(7801)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(7802)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    d = json.loads(path.read_text())
    d["torch_dtype"] = "float32"
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "bos_token": None,
         "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return model, tokenizer


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                      target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                      task_type="CAUSAL_LM")


def draw_adapter(peft_model):
    """A and B drawn (B = 0 would make the policy the reference), saved as `lora/`."""
    g = torch.Generator().manual_seed(7803)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(HERE / "lora")
    (HERE / "lora" / "README.md").unlink(missing_ok=True)


def lora_grads(peft_model, prefix):
    out = {}
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            assert p.grad is not None, name
            key = name.replace(".default", "")
            out[f"{prefix}.grad.{key}"] = p.grad.detach().clone().contiguous()
            p.grad = None
    return out


def main():
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    model, tokenizer = make_model()
    (HERE / "pairs.jsonl").write_text("".join(
        json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in PAIRS))
    data = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    tensors, summary = {}, {}

    # DPO: the trainer's own tokenization, collator and loss; the reference is the base (adapter off).
    args = DPOConfig(output_dir=str(HERE / "tmp"), beta=BETA, loss_type=["sigmoid"],
                     per_device_train_batch_size=len(PAIRS), report_to=[], use_cpu=True,
                     precompute_ref_log_probs=False, dataset_num_proc=None)
    # The adapter is new to the trainer (peft_config), so its reference is the base with the
    # adapter disabled; drawn after, the policy is not the reference.
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         peft_config=lora_config())
    peft_model = trainer.model
    assert list(peft_model.peft_config) == ["default"], list(peft_model.peft_config)
    draw_adapter(peft_model)
    examples = [trainer.train_dataset[i] for i in range(len(PAIRS))]
    ids = [{k: list(e[k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for e in examples]
    batch = trainer.data_collator(examples)
    peft_model.train()
    loss = trainer._compute_loss(peft_model, batch, return_outputs=False)
    loss.backward()
    tensors["dpo.loss"] = loss.detach().reshape(1).contiguous()
    tensors.update(lora_grads(peft_model, "dpo"))
    summary["dpo"] = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    # The sequence log-probabilities both sides of DPO's loss (sums over completion tokens).
    def logps(model_call):
        with torch.no_grad():
            logits = model_call(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, batch["input_ids"][:, 1:, None])[..., 0]
        return (lp * batch["completion_mask"][:, 1:]).sum(1)
    policy = logps(peft_model)
    with peft_model.disable_adapter():
        ref = logps(peft_model)
    n = len(PAIRS)
    tensors["dpo.chosen_logps"], tensors["dpo.rejected_logps"] = policy[:n].contiguous(), policy[n:].contiguous()
    tensors["dpo.ref_chosen_logps"], tensors["dpo.ref_rejected_logps"] = ref[:n].contiguous(), ref[n:].contiguous()

    # ORPO on the same token ids (its batch keys built from DPO's tokenization).
    oargs = ORPOConfig(output_dir=str(HERE / "tmp"), beta=BETA, report_to=[], use_cpu=True,
                       per_device_train_batch_size=len(PAIRS), max_length=128,
                       dataset_num_proc=None)
    otrainer = ORPOTrainer(model=peft_model, args=oargs, train_dataset=data, processing_class=tokenizer)

    def side(key):
        rows = [e["prompt_ids"] + e[key] for e in ids]
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [1] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        labels = torch.tensor([[-100] * len(e["prompt_ids"]) + e[key] + [-100] * (width - len(r))
                               for e, r in zip(ids, rows)])
        return input_ids, mask, labels
    obatch = {}
    for key, name in (("chosen_ids", "chosen"), ("rejected_ids", "rejected")):
        obatch[f"{name}_input_ids"], obatch[f"{name}_attention_mask"], obatch[f"{name}_labels"] = side(key)
    otrainer.padding_value = 1
    oloss, ometrics = otrainer.get_batch_loss_metrics(peft_model, obatch)
    oloss.backward()
    tensors["orpo.loss"] = oloss.detach().reshape(1).contiguous()
    tensors["orpo.nll"] = torch.tensor([ometrics["nll_loss"]])
    tensors.update(lora_grads(peft_model, "orpo"))
    summary["orpo"] = ometrics
    with torch.no_grad():
        out = otrainer.concatenated_forward(peft_model, obatch)
    tensors["orpo.chosen_logps"], tensors["orpo.rejected_logps"] = out[0].contiguous(), out[1].contiguous()

    save_file(tensors, str(HERE / "reference.safetensors"), metadata={"format": "oracle-v1"})
    (HERE / "reference.json").write_text(json.dumps({"beta": BETA, "ids": ids, "metrics": summary},
                                                    indent=1, sort_keys=True, default=float) + "\n")
    shutil.rmtree(HERE / "tmp", ignore_errors=True)
    print("dpo loss", tensors["dpo.loss"].item(), "orpo loss", tensors["orpo.loss"].item())
    print(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
    main()

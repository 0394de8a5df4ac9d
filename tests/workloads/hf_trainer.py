"""A transformers Trainer as a user builds one for trainer.train(), returned as it is (issue 33).

A two-layer GPT-2 built from its config (nothing downloaded) learns to count: each sequence runs on from a random
token, modulo the vocabulary. TrainingArguments give a linear schedule with warm-up, max_steps, accumulation,
clipping and evaluation every 4 steps.
"""

import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB, LENGTH = 32, 16


class Counting(Dataset):
    def __init__(self, size: int, seed: int) -> None:
        self.starts = torch.randint(0, VOCAB, (size,), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict:
        tokens = (self.starts[index] + torch.arange(LENGTH)) % VOCAB
        return {"input_ids": tokens, "labels": tokens.clone(), "note": "a column the model does not take"}


def arguments(**overrides) -> TrainingArguments:
    settings = dict(
        output_dir=os.path.join(tempfile.gettempdir(), "torchlab-hf-test"), report_to="none",
        max_steps=12, per_device_train_batch_size=4, learning_rate=3e-3,
        gradient_accumulation_steps=int(os.environ.get("TORCHLAB_TEST_ACCUM", "2")),  # edited before a resume
        weight_decay=0.01, warmup_steps=3, lr_scheduler_type="linear", max_grad_norm=1.0,
        eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=8,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


def model() -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def workload() -> Trainer:
    return Trainer(model=model(), args=arguments(), train_dataset=Counting(256, 0), eval_dataset=Counting(64, 1))


def one_sequence() -> Trainer:
    """Every sample the same sequence, no evaluation: the order of the batches does not matter, so the engine's steps
    can be compared with trainer.train()'s one by one."""
    data = Counting(64, 0)
    data.starts.fill_(5)
    return Trainer(model=model(), args=arguments(eval_strategy="no", logging_steps=1), train_dataset=data)


class SmoothedTrainer(Trainer):
    """A user's own compute_loss: the model's loss plus a penalty on the logits' size, and where the run is."""

    steps_seen: list = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        SmoothedTrainer.steps_seen.append(self.state.global_step)
        outputs = model(**inputs)
        loss = outputs.loss + 1e-3 * outputs.logits.pow(2).mean()
        return (loss, outputs) if return_outputs else loss


def own_compute_loss() -> Trainer:
    return SmoothedTrainer(model=model(), args=arguments(eval_strategy="no"), train_dataset=Counting(256, 0))


def by_epochs() -> Trainer:
    """Two epochs of 100 samples at a batch of 8 (12 whole batches each) with accumulation 2: 2 x 6 steps."""
    return Trainer(model=model(), args=arguments(max_steps=-1, num_train_epochs=2, per_device_train_batch_size=8,
                                                 eval_strategy="epoch"), train_dataset=Counting(100, 0),
                   eval_dataset=Counting(16, 1))


def bf16_checkpointed() -> Trainer:
    return Trainer(model=model(), args=arguments(bf16=True, activation_checkpointing=True, use_cpu=True, eval_strategy="no"),
                   train_dataset=Counting(256, 0))


def overrides_training_step() -> Trainer:
    class StepOfItsOwn(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            return super().training_step(model, inputs, num_items_in_batch)

    return StepOfItsOwn(model=model(), args=arguments(eval_strategy="no"), train_dataset=Counting(64, 0))


def early_stopping() -> Trainer:
    from transformers import EarlyStoppingCallback

    return Trainer(model=model(), args=arguments(metric_for_best_model="loss", load_best_model_at_end=True,
                                                 save_strategy="steps", save_steps=4),
                   train_dataset=Counting(64, 0), eval_dataset=Counting(16, 1),
                   callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])


def given_optimizer_and_scheduler() -> Trainer:
    """optimizers=(optimizer, scheduler): the user's own, made for 12 steps."""
    network = model()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=12)
    return Trainer(model=network, args=arguments(eval_strategy="no"), train_dataset=Counting(64, 0),
                   optimizers=(optimizer, scheduler))


class Reverse(Dataset):
    """Sequences of 3 to 9 tokens to write backwards, padded by the collator below."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(3, VOCAB, (int(torch.randint(3, 10, (1,), generator=generator)),), generator=generator)
                     for _ in range(size)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.rows[index], "labels": self.rows[index].flip(0)}


def padded(rows: list) -> dict:
    width = max(len(row["input_ids"]) for row in rows)
    ids = torch.stack([torch.nn.functional.pad(row["input_ids"], (0, width - len(row["input_ids"]))) for row in rows])
    labels = torch.stack([torch.nn.functional.pad(row["labels"], (0, width - len(row["labels"])), value=-100) for row in rows])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}


def seq2seq() -> Trainer:
    """A T5 (an encoder-decoder: its decoder keeps a copy of the model's config) trained by a Seq2SeqTrainer."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration

    network = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=2,
                                                  d_kv=16, decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.0))
    args = Seq2SeqTrainingArguments(output_dir=os.path.join(tempfile.gettempdir(), "torchlab-hf-test"), report_to="none",
                                    max_steps=6, per_device_train_batch_size=8, learning_rate=3e-3, eval_strategy="no")
    return Seq2SeqTrainer(model=network, args=args, train_dataset=Reverse(64), data_collator=padded)


def plain_workload():
    """A T5 in a plain Workload, its configs' use_cache left on (as they are by default): checkpointing its blocks
    must not let the decoder's cross-attention cache be filled in the forward and read in the recompute."""
    from torchlab.core.workload import Workload

    trainer = seq2seq()
    return Workload(model=trainer.model, dataset=Reverse(64), collate_fn=padded, batch_size=8,
                    loss_fn=lambda network, batch: network(**batch).loss)

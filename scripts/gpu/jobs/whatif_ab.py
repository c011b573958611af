#!/usr/bin/env python3
"""The judge of vramtop's remedies: each workload once under `vramtop run --history` with no
remedy (vramtop's verdicts at its OOM: live from `vramtop attach --json`, and from the job's
history by `vramtop replay --report --json` of the snapshot kept at the OOM), then once per
remedy in a fresh process (did PyTorch serve the judged request?).

  python3 whatif_ab.py job WORKLOAD [REMEDY]   one run; prints `judged: {...}`
  python3 whatif_ab.py ab PATH/TO/vramtop OUT  every workload, every remedy; OUT/ab.jsonl,
                                               OUT/table.md

Workloads (each ends with one judged request, caught so the process ends normally):
  checker     set_per_process_memory_fraction(0.1); as many 6 MiB tensors as the plain
              allocator holds under it (three to a 20 MiB segment), every other freed;
              1 GiB asked.
  splitcache  a 7.9 GiB cap; a 6 GiB block cached, then split by 20 tensors of 304 MiB,
              every other freed; 2.5 GiB asked.
  tails       a 2,010 MiB cap; 300 tensors of 6 MiB (100 segments of 20 MiB, a 2 MiB tail
              each); 100 MiB asked.
  gpt2var     a GPT-2 (6 layers, random weights) trained on batches whose length grows
              with jitter, under a 6 GiB cap; judged: the step the plain run failed.
  kvcache     a KV cache of 24 layers grown by torch.cat each step under a 4 GiB cap;
              judged: the step the plain run failed.
  kvcache_steps  kvcache that marks its steps with `vramtop.step()` (no optimizer to mark
              them), as vramtop's reason for `cannot tell` advises.
  gpt2mixed   a GPT-2 (6 layers, 1024 wide, random weights, AdamW, bf16 autocast) whose
              batch and sequence length both vary from step to step, under a 15.5 GiB
              cap (WHATIF_GPT2MIXED_CAP_GIB sets another); judged: the step the plain run
              failed. It dies at step 93 asking 2.26 GiB under each cap tried, 12.5 to 15.5
              GiB (`scan`, H100); from 15.5 GiB expandable segments get past it (the
              cache's fragmentation ends the job there, not the batch).
  llamamix    a Llama (transformers' LlamaForCausalLM: 8 layers, 1024 wide, grouped-query
              attention, random weights, AdamW, bf16 autocast) whose batch and sequence
              length vary from step to step, under a cap (WHATIF_LLAMAMIX_CAP_GIB, 10 by
              default); judged: the step the plain run failed. Not one the verdicts were
              built on: a second architecture for the same user.
  resnetvar   a ResNet-50 (transformers' ResNetForImageClassification, random weights,
              fp32, SGD with momentum) whose batch (8 to 32) and resolution (128 to 384,
              the largest growing) vary each step, under a 6.5 GiB cap
              (WHATIF_RESNETVAR_CAP_GIB); it dies at step 97 asking 62 MiB with 268 MiB
              free in the cache, and no setting gets its step through (H100).
  bertaccum   BERT (BertForMaskedLM, 6 layers, random weights, bf16 autocast, AdamW) with
              gradient accumulation: four micro-batches of their own batch and length a
              step, under an 8 GiB cap (WHATIF_BERTACCUM_CAP_GIB); it dies at step 46
              asking 1.46 GiB (H100; under 7 GiB expandable segments fail too).
  t5var       a T5 (T5ForConditionalGeneration, 6 layers, 512 wide, random weights, bf16
              autocast, AdamW) whose source and target lengths vary apart, under an 8 GiB
              cap (WHATIF_T5VAR_CAP_GIB); it dies at step 50 asking 132 MiB (under 5 GiB at
              step 45 asking 182 MiB), and expandable segments fail too (H200).
  gpt2ckpt    a GPT-2 (8 layers, 1024 wide, random weights, AdamW, bf16 autocast) with
              activation checkpointing (gradient_checkpointing_enable: each block's
              activations are made again in the backward), batch and length varying, under
              an 8 GiB cap (WHATIF_GPT2CKPT_CAP_GIB).
  evalmix     llamamix with an evaluation every fifth step (two batches of 12 under
              no_grad, no optimizer step, so they fall in the next training step's marks),
              under a 10 GiB cap (WHATIF_EVALMIX_CAP_GIB).
  gpt2keep    gpt2mixed's GPT-2 that keeps each step's last hidden states (detached, never
              freed: a leak), under a cap (WHATIF_GPT2KEEP_CAP_GIB).
  gan         a DCGAN (64x64, 256 wide, Adam): two optimizers, so two steps marked an
              iteration, the batch varying and growing, under a cap (WHATIF_GAN_CAP_GIB).
  vitvar      a ViT-Base (transformers' ViTForImageClassification, random weights, bf16
              autocast, AdamW) whose batch (16 to 64) and resolution (128 to 448, position
              embeddings interpolated) vary, under a cap (WHATIF_VITVAR_CAP_GIB).
  moemix      a Mixtral (transformers' MixtralForCausalLM: 6 layers, 768 wide, 8 experts,
              2 a token, random weights, bf16 autocast, AdamW) whose batch and length vary:
              each expert's share of the tokens, so its activations' sizes, turn on the
              router from step to step (WHATIF_MOEMIX_CAP_GIB).
  gpt2scaler  gpt2mixed's GPT-2 in fp16 autocast with a GradScaler that grows its scale
              every 8 steps, so that steps whose gradients overflow skip the optimizer
              (no step marked: two iterations fall in one marked step), under a cap
              (WHATIF_GPT2SCALER_CAP_GIB).
  loramix     llamamix's Llama with its weights frozen and low-rank adapters (rank 16) on
              every attention and MLP projection, as LoRA fine-tuning does: gradients and
              optimizer state for the adapters alone (WHATIF_LORAMIX_CAP_GIB).
  gpt2compile gpt2mixed's GPT-2 compiled (torch.compile, dynamic shapes): Inductor's
              kernels allocate their own buffers (WHATIF_GPT2COMPILE_CAP_GIB).
  llamagen    llamamix's Llama generating (transformers' generate, greedy, KV cache) for
              batches of prompts whose size, length and new tokens vary and grow: no
              optimizer, so no step marked (WHATIF_LLAMAGEN_CAP_GIB).
  gpt2stream  gpt2mixed's GPT-2 fed by a side stream: each step's input embeddings and
              labels made on a second CUDA stream (so in its own pool of the cache) and
              handed over with record_stream (WHATIF_GPT2STREAM_CAP_GIB).
  t5beam      a T5 (t5var's) translating batches with beam search (4 beams:
              the cache reordered at each token), batches and lengths growing, no
              optimizer (WHATIF_T5BEAM_CAP_GIB).
  t5beam_steps  t5beam that marks each `generate` call a step with `vramtop.step()`, as
              vramtop's reason for `cannot tell` advises (WHATIF_T5BEAM_STEPS_CAP_GIB).
  wav2vec     a Wav2Vec2 (base, random weights) trained with CTC on raw audio whose
              batch and length (1 to 30 s at 16 kHz) vary: its convolutional front end
              makes the step's largest blocks, in fp32 (WHATIF_WAV2VEC_CAP_GIB).
  mambaslow   a Mamba (8 layers, 768 wide) on transformers' own path, without mamba-ssm's
              kernels: the scan is a Python loop over the sequence, so each step makes
              tens of thousands of small allocations (WHATIF_MAMBASLOW_CAP_GIB).
  hftrainer   gpt2mixed's GPT-2 stepped by Hugging Face's Trainer itself (bf16, its AdamW
              and linear schedule, gradients clipped to 1.0 through accelerate, its
              training_step), batches and lengths varying (WHATIF_HFTRAINER_CAP_GIB).
  gpt2sgd     gpt2mixed's GPT-2 updated by the loop's own code (SGD with momentum under
              no_grad, its buffers made in the first step), no torch optimizer: no step
              marked, the rounds of its memory stand in (WHATIF_GPT2SGD_CAP_GIB).
  resnetinfer resnetvar's ResNet-50 classifying batches in eval mode under no_grad, batch
              (32 to 128) and resolution (128 to 512) varying and growing, no optimizer:
              no step marked (WHATIF_RESNETINFER_CAP_GIB).
  lightning   gpt2mixed's GPT-2 trained by PyTorch Lightning's Trainer (bf16-mixed, AdamW):
              the batches come from a DataLoader on the host, and the forward and
              backward run inside the optimizer's step (Lightning's closure), so the
              step's mark comes after its whole work (WHATIF_LIGHTNING_CAP_GIB).
  lightningaccum  lightning with accumulate_grad_batches=2: two batches an optimizer
              step, the gradients dropped after the first one's forward
              (WHATIF_LIGHTNINGACCUM_CAP_GIB).
  gpt2tutorial  gpt2mixed's GPT-2 in the tutorial's order: zero_grad() first, then the
              forward, the backward and the step, so the gradients live from one
              step's backward to the next step's start (WHATIF_GPT2TUTORIAL_CAP_GIB).
  gpt2fixed   a GPT-2 whose batch never changes, too big for its cap: the first step
              fits, the second (AdamW's state now held) runs out; a batch too big, not
              fragmentation (WHATIF_GPT2FIXED_CAP_GIB).
  llamafixed  a Llama (8 layers, 1024 wide, random weights, bf16 autocast, AdamW) whose
              batch (8 x 1024) never changes: as gpt2fixed, the second step runs out
              where a cap is under the first step's peak plus AdamW's state
              (WHATIF_LLAMAFIXED_CAP_GIB).
  vitfixed    a ViT-Base (bf16 autocast, AdamW) on one batch shape, 128 images of 224 x
              224: as gpt2fixed, an image model's second step (WHATIF_VITFIXED_CAP_GIB).
  resnetfixed a ResNet-50 (channels_last, cuDNN's benchmark on, fp16 autocast with a
              GradScaler, SGD with momentum and weight decay) on one batch shape, 192
              images of 224 x 224: the momentum is made at the first step the scaler
              lets through, and cuDNN tries its algorithms in the first step
              (WHATIF_RESNETFIXED_CAP_GIB).
  bertfixed   a BERT-Base masked LM on one batch shape (32 x 512) in the Hugging Face
              examples' order: backward, clipping, AdamW's step, a linear schedule's
              step, then zero_grad() (WHATIF_BERTFIXED_CAP_GIB).
  llamatune   a Llama of about 0.85 billion parameters (16 layers, 2048 wide) fine-tuned
              on one batch shape (8 x 1024, bf16 autocast, AdamW): its optimizer's state
              (6.8 GB) outweighs a step's activations, as in a user's fine-tuning, so the
              second step holds far more than the first (WHATIF_LLAMATUNE_CAP_GIB).
  gpt2compilefixed  gpt2fixed compiled (torch.compile, default mode): the first step
              compiles the forward and the backward, Triton's autotuning allocating as
              it goes (WHATIF_GPT2COMPILEFIXED_CAP_GIB).
  gpt2scalerfixed  gpt2fixed in fp16 autocast with a GradScaler whose scale starts
              high (2**40): the gradients overflow and the scaler skips the optimizer's
              step (no mark, no AdamW state) until its scale has halved enough, 19
              steps on an H200 (at 2**20 it skipped none) (WHATIF_GPT2SCALERFIXED_CAP_GIB).
  gpt2scalerskip  gpt2scaler with its scale starting at 2**40: its shapes vary and
              it skips its first optimizer steps, none marked, so the hook's marks of
              the model's passes stand for them (WHATIF_GPT2SCALERSKIP_CAP_GIB).
  gpt2scalermid  gpt2scaler whose gradients are made inf after the backward of every
              fourth step from step 2 (2, 6, 10, ...): GradScaler skips those steps in
              the middle of a run, after marked ones (WHATIF_GPT2SCALERMID_CAP_GIB).
  segformervar  a SegFormer (MiT-b0, random weights) trained for semantic segmentation of
              150 classes, batch and square side varying, the largest side growing
              (WHATIF_SEGFORMERVAR_CAP_GIB).
  gpt2offload  gpt2scaler's GPT-2 in bf16 with its saved activations offloaded to pinned
              host memory (save_on_cpu) (WHATIF_GPT2OFFLOAD_CAP_GIB).
  dlrmsparse  a recommendation model: 8 embedding tables (2M x 64) in bags of varying size
              with sparse gradients (SparseAdam), an MLP over them (Adam)
              (WHATIF_DLRMSPARSE_CAP_GIB).
  distill     knowledge distillation: a GPT-2 teacher (8 layers, 1024 wide, bf16 weights,
              frozen, eval, no_grad) and a GPT-2 student (4 layers, 768 wide, AdamW, bf16
              autocast) on gpt2scaler's varying shapes; the loss mixes the next token's
              cross-entropy with the KL divergence from the teacher's softened logits, so the
              teacher's logits live through the student's backward (WHATIF_DISTILL_CAP_GIB).
  convnextema  a ConvNeXt-Tiny (random weights) trained at multiple scales (side 160 to
              384, the largest growing, the batch smaller at the larger sides) as vision
              recipes do: bf16 autocast, AdamW, gradient clipping, a cosine schedule and an
              EMA of the weights (torch.optim.swa_utils.AveragedModel, its foreach update)
              (WHATIF_CONVNEXTEMA_CAP_GIB).
  whispervar  a Whisper (6 + 6 layers, 512 wide, random weights) trained for speech
              recognition: 30 s of log-mel features a sample (the encoder's 1,500 frames
              fixed), the batch (4 to 32) and the transcript's length (16 to 448 tokens, the
              longest growing) varying, bf16 autocast, AdamW (WHATIF_WHISPERVAR_CAP_GIB).
  gnnvar      graph learning on neighbour-sampled mini-batches: each batch a graph of
              its own node and edge counts (20,000 to 60,000 nodes and more each step, 4 to
              24 edges a node), 4 GraphSAGE layers 512 wide whose messages are gathered
              along the edges and summed into their targets (index_add_), bf16 autocast,
              AdamW: no two steps' tensors alike (WHATIF_GNNVAR_CAP_GIB).
  detrvar     object detection: a DETR (transformers' ResNet-50 backbone, 6 + 6 layers,
              random weights) trained on batches of 2 to 8 images padded to the batch's
              largest, each side 480 to 1,333 as DETR's multi-scale augmentation draws them,
              1 to 40 boxes an image, the Hungarian matching's loss, AdamW, gradient
              clipping (WHATIF_DETRVAR_CAP_GIB).
  maskrcnnvar torchvision's detection reference: a Mask R-CNN (ResNet-50 FPN, random
              weights) trained with SGD and momentum under fp16 autocast and a GradScaler, on
              2 to 8 images of their own sizes (each side 320 to 1,024; the model resizes
              them), 1 to 60 objects each with a box and a mask (WHATIF_MASKRCNNVAR_CAP_GIB).
  timmprog    timm's recipe with progressive resizing: an EfficientNet-B2 (random weights,
              drop path), channels_last, bf16 autocast, AdamW, label smoothing, cuDNN's
              benchmark, an EMA (timm's ModelEmaV3); the side ramps from 128 to 320 over
              the run with jitter, the batch smaller at the larger sides
              (WHATIF_TIMMPROG_CAP_GIB).
  gpt2finder  a batch-size finder as accelerate's find_executable_batch_size runs one: a
              step of gpt2mixed's GPT-2 at 1,024 tokens tried at batch 64, halved at each
              OOM (caught; the cache emptied, as accelerate's release_memory does), then
              training at the batch that got through on lengths that vary and grow
              (WHATIF_GPT2FINDER_CAP_GIB).
  hftrainerskip  hftrainer in fp16, accelerate's GradScaler starting at 2**40: the
              Trainer's step with its first optimizer steps skipped, none marked
              (WHATIF_HFTRAINERSKIP_CAP_GIB).
  gpt2accumfirst  gpt2fixed's GPT-2 with its gradients accumulated over 8 micro-batches of
              1024 tokens, 2 to 9 sequences, each larger than the last, before AdamW's
              step: capped to run out inside the first step (WHATIF_GPT2ACCUMFIRST_CAP_GIB).
  gpt2accumskip  gpt2scalerskip with two micro-batches of varying shape accumulated a
              step: its first optimizer steps skipped, none marked, the passes marked
              only after zero_grad() (WHATIF_GPT2ACCUMSKIP_CAP_GIB).
  gpt2ddpaccumskip  gpt2accumskip in DistributedDataParallel (gpt2ddp's one rank over
              NCCL): each micro-batch's backward all-reduced, and the reduced gradients
              copied back in place by DDP's own end-of-backward callback, so the passes
              must be told after it (WHATIF_GPT2DDPACCUMSKIP_CAP_GIB).
  clipvar     a CLIP (ViT-B/16 and a text tower, random weights) trained contrastively:
              the batch (images and captions of varying length) varies, so the
              similarity matrix and every activation change shape (WHATIF_CLIPVAR_CAP_GIB).
  gpt2fused   gpt2mixed's GPT-2 in older code's habits: gradients zeroed in place
              (set_to_none=False, so they stay allocated), AdamW's fused kernel,
              clipping, a cosine schedule (WHATIF_GPT2FUSED_CAP_GIB).
  accelaccum  a Llama (6 layers, eager attention: memory grows as the square of the
              length) trained through accelerate: Accelerator(bf16, two micro-batches a
              step), its prepared DataLoader, accumulate(), backward(), clipping
              (WHATIF_ACCELACCUM_CAP_GIB).
  llamabf16   a Llama (8 layers) trained in pure bf16 (weights, gradients and AdamW's state
              all bf16, no autocast), PyTorch's own attention (SDPA), activation
              checkpointing without reentrancy, batch and length varying, as fine-tuning
              scripts do (WHATIF_LLAMABF16_CAP_GIB).
  unetvar     a U-Net (four levels, 64 to 512 channels, group norm) trained for
              segmentation (21 classes, a loss per pixel) under bf16 autocast, AdamW, batch
              (4 to 16) and resolution (128 to 512) varying, the largest growing: skip
              connections hold each level's activations until the decoder
              (WHATIF_UNETVAR_CAP_GIB).
  graphsteps  an MLP (6 blocks, 2048 wide, AdamW capturable) trained by CUDA graphs, as
              PyTorch's whole-network capture does: each batch size's step captured once
              (torch.cuda.graph, its own private pool) and replayed after, the batch growing
              (WHATIF_GRAPHSTEPS_CAP_GIB). The memory each graph's pool keeps is no other's.
  graphsonce  graphsteps warmed up once, at its first batch size, every new size captured
              straight away, so that a new size's first allocations, and an OOM among
              them, come during its capture (WHATIF_GRAPHSONCE_CAP_GIB).
  gpt2graphs  gpt2mixed's GPT-2 under torch.compile(mode="reduce-overhead"): cudagraph
              trees run each new shape once in their own pool, record it there and replay
              it; lengths in buckets of 128, the longest growing (WHATIF_GPT2GRAPHS_CAP_GIB).
  llamagraphs a Llama (6 layers, llama_config) under torch.compile(mode="reduce-overhead"),
              fused AdamW, batch 2 to 8 and length in buckets of 256, the longest
              growing (WHATIF_LLAMAGRAPHS_CAP_GIB).
  gpt2empties gpt2mixed with torch.cuda.empty_cache() after every tenth step, as some
              training scripts do "to free memory" (WHATIF_GPT2EMPTIES_CAP_GIB).
  gpt2ddp     gpt2mixed's GPT-2 in DistributedDataParallel, one rank over NCCL (world
              size 1, a FileStore of its own): gradient buckets and the all-reduce on
              NCCL's stream (WHATIF_GPT2DDP_CAP_GIB).
  gpt2ddp2    gpt2ddp as a torchrun job of two ranks (torch.distributed.run --standalone,
              which `job` starts itself): one GPU each over NCCL where the machine has two,
              else both on one over gloo. Each rank draws its own batches (as a
              DistributedSampler hands each its own samples), so one rank runs out first;
              the run's outcome is its failing rank's (WHATIF_GPT2DDP2_CAP_GIB, per rank;
              WHATIF_DDP_SWAP=1 swaps the ranks' draws, so the other rank runs out).
  gpt2fsdp2   gpt2ddp2's job sharded by FSDP2 (`fully_shard` on each block and the root):
              per-block all-gathers on FSDP's stream, gradients reduce-scattered, half
              the optimizer state a rank (WHATIF_GPT2FSDP2_CAP_GIB, per rank).
  gpt2fsdp1   the same under FSDP's first form (FullyShardedDataParallel, each block
              auto-wrapped as a FlatParameter unit), as accelerate and the HF Trainer set
              it up (WHATIF_GPT2FSDP1_CAP_GIB, per rank).
  gpt2loader  gpt2mixed's GPT-2 fed as most users feed it: a DataLoader with 4 worker
              processes (forked; WHATIF_LOADER_START=spawn starts them fresh, each
              importing torch and the hook of its own), pinned host memory, batches of
              samples of their own lengths padded to the longest with an attention mask,
              copied with non_blocking=True (WHATIF_GPT2LOADER_CAP_GIB).
  otherproc   a second process holds a 60 GiB cache on the same GPU (freed tensors,
              not released); this one asks for 30 GiB.

The plain run is a plain `vramtop run` (WHATIF_RUN_FLAGS adds flags, say --history). The
control is the same job in a fresh process with no vramtop and no remedy, judged at the same
step: where it does not run out of memory there, the OOM vramtop judged was not plain
PyTorch's, and the workload's rows are counted apart ("not reproduced").

  python3 whatif_ab.py nudge WORKLOAD REMEDY STEP MB...   REMEDY judged at STEP once per
                                                 MB of device memory taken first outside
                                                 PyTorch (0: none): does PyTorch's outcome
                                                 turn on where CUDA places its segments?
  python3 whatif_ab.py scan WORKLOAD CAP_GIB...   the stepped workload without vramtop
                                                 under each cap, plainly and with
                                                 expandable_segments: the step each died
  WHATIF_PROFILE=1 python3 whatif_ab.py job WORKLOAD   each step's peak allocated and
                                                 reserved bytes printed (sizing a cap)

  WHATIF_DUMP=FILE python3 whatif_ab.py job WORKLOAD REMEDY   one run (PYTORCH_CUDA_ALLOC_CONF
                                                 and WHATIF_STOP_AT as `fresh` sets them)
                                                 with PyTorch's ring of the whole run,
                                                 dumped to FILE at the judged step: PyTorch's
                                                 own history of a remedy's run, for holding
                                                 vramtop's replay of it against PyTorch

Remedies: none, empty_cache (torch.cuda.empty_cache() before the judged request, or in
the stepped workloads before the judged step), empty_cache_steps (stepped workloads:
torch.cuda.empty_cache() after every step, judged by `empty_cache() between steps`),
other_empty_cache (otherproc: the other process calls it before the judged request),
gc_collect, expandable, max_split:N, gc_threshold:0.6, roundup:N, expandable_gc
(PYTORCH_CUDA_ALLOC_CONF). roundup is run at every N vramtop tries (2, 4, 8, 16).
WHATIF_REMEDIES=roundup (a comma-separated list of name prefixes) runs only those, and the
control.

WHATIF_COMPILE_IN_PLACE=1 compiles gpt2compilefixed's model with Module.compile() instead of
torch.compile(model); WHATIF_COMPILE_EAGER_ROOT=1 calls an eager root module (nn.Identity)
each step beside it.

WHATIF_GPU_FREE_MIB runs the job as on a smaller GPU, with no memory fraction: each process
first takes through the CUDA driver all but that much of what the device has free, and no
cap is set (the workload's CAP_ENV is ignored), so the job runs out where CUDA itself
refuses a segment, as on a card of that size. Processes then share the device's free
memory: run them one at a time (WHATIF_JOBS=1).

WHATIF_BASE_CONF is the job's own PYTORCH_CUDA_ALLOC_CONF (say "expandable_segments:True",
as many users already set): the run under vramtop, the control and every remedy run keep
it, and a remedy's setting goes into that line, as a user puts the setting vramtop names
into the line the job already has (a key the job set already takes the remedy's value).
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
GiB = 1 << 30
WORKLOADS = ["checker", "splitcache", "tails", "gpt2var", "kvcache", "gpt2mixed", "llamamix", "resnetvar",
             "bertaccum", "t5var", "gpt2ckpt", "evalmix", "gpt2keep", "gan", "vitvar", "moemix", "gpt2scaler", "loramix", "gpt2compile", "llamagen", "gpt2stream", "t5beam", "t5beam_steps", "wav2vec", "mambaslow", "hftrainer", "gpt2sgd", "resnetinfer", "lightning", "lightningaccum", "gpt2tutorial", "gpt2fixed", "clipvar", "gpt2fused", "accelaccum", "llamabf16", "unetvar", "graphsteps", "graphsonce", "gpt2graphs", "llamagraphs", "gpt2empties", "gpt2ddp", "gpt2ddp2", "gpt2fsdp2", "gpt2fsdp1", "gpt2loader", "llamafixed", "vitfixed", "resnetfixed", "bertfixed", "llamatune", "gpt2compilefixed", "gpt2scalerfixed", "gpt2scalerskip", "gpt2scalermid", "segformervar", "gpt2offload", "dlrmsparse", "distill", "convnextema", "whispervar", "hftrainerskip", "gpt2accumfirst", "gpt2accumskip", "gpt2ddpaccumskip", "gnnvar", "detrvar", "maskrcnnvar", "timmprog", "gpt2finder", "otherproc"]
# The cap of each stepped workload that takes one from the environment (`scan` varies it).
CAP_ENV = {"gpt2mixed": ("WHATIF_GPT2MIXED_CAP_GIB", 15.5), "llamamix": ("WHATIF_LLAMAMIX_CAP_GIB", 10),
           "resnetvar": ("WHATIF_RESNETVAR_CAP_GIB", 6.5), "bertaccum": ("WHATIF_BERTACCUM_CAP_GIB", 8),
           "t5var": ("WHATIF_T5VAR_CAP_GIB", 8), "gpt2ckpt": ("WHATIF_GPT2CKPT_CAP_GIB", 8),
           "evalmix": ("WHATIF_EVALMIX_CAP_GIB", 10), "gpt2keep": ("WHATIF_GPT2KEEP_CAP_GIB", 10),
           "gan": ("WHATIF_GAN_CAP_GIB", 10), "vitvar": ("WHATIF_VITVAR_CAP_GIB", 10),
           "moemix": ("WHATIF_MOEMIX_CAP_GIB", 10), "gpt2scaler": ("WHATIF_GPT2SCALER_CAP_GIB", 10),
           "loramix": ("WHATIF_LORAMIX_CAP_GIB", 10), "gpt2compile": ("WHATIF_GPT2COMPILE_CAP_GIB", 10),
           "llamagen": ("WHATIF_LLAMAGEN_CAP_GIB", 10), "gpt2stream": ("WHATIF_GPT2STREAM_CAP_GIB", 10),
           "t5beam": ("WHATIF_T5BEAM_CAP_GIB", 10), "gpt2sgd": ("WHATIF_GPT2SGD_CAP_GIB", 10),
           "resnetinfer": ("WHATIF_RESNETINFER_CAP_GIB", 10), "t5beam_steps": ("WHATIF_T5BEAM_STEPS_CAP_GIB", 10),
           "wav2vec": ("WHATIF_WAV2VEC_CAP_GIB", 10), "mambaslow": ("WHATIF_MAMBASLOW_CAP_GIB", 10),
           "hftrainer": ("WHATIF_HFTRAINER_CAP_GIB", 10),
           # The caps the README's runs used (H200, 2026-11-27).
           "lightning": ("WHATIF_LIGHTNING_CAP_GIB", 10.8),
           "lightningaccum": ("WHATIF_LIGHTNINGACCUM_CAP_GIB", 11.5),
           "gpt2tutorial": ("WHATIF_GPT2TUTORIAL_CAP_GIB", 10.3),
           "gpt2fixed": ("WHATIF_GPT2FIXED_CAP_GIB", 14.6), "clipvar": ("WHATIF_CLIPVAR_CAP_GIB", 27.5),
           "gpt2fused": ("WHATIF_GPT2FUSED_CAP_GIB", 10), "accelaccum": ("WHATIF_ACCELACCUM_CAP_GIB", 10),
           "llamabf16": ("WHATIF_LLAMABF16_CAP_GIB", 10), "unetvar": ("WHATIF_UNETVAR_CAP_GIB", 10),
           "graphsteps": ("WHATIF_GRAPHSTEPS_CAP_GIB", 10), "graphsonce": ("WHATIF_GRAPHSONCE_CAP_GIB", 10),
           "gpt2graphs": ("WHATIF_GPT2GRAPHS_CAP_GIB", 10), "llamagraphs": ("WHATIF_LLAMAGRAPHS_CAP_GIB", 10),
           "gpt2empties": ("WHATIF_GPT2EMPTIES_CAP_GIB", 14.5), "gpt2ddp": ("WHATIF_GPT2DDP_CAP_GIB", 10),
           "gpt2ddp2": ("WHATIF_GPT2DDP2_CAP_GIB", 10), "gpt2fsdp2": ("WHATIF_GPT2FSDP2_CAP_GIB", 10),
           "gpt2fsdp1": ("WHATIF_GPT2FSDP1_CAP_GIB", 10),
           "gpt2loader": ("WHATIF_GPT2LOADER_CAP_GIB", 10),
           "llamafixed": ("WHATIF_LLAMAFIXED_CAP_GIB", 10),
           "vitfixed": ("WHATIF_VITFIXED_CAP_GIB", 10),
           "resnetfixed": ("WHATIF_RESNETFIXED_CAP_GIB", 12),
           "bertfixed": ("WHATIF_BERTFIXED_CAP_GIB", 12),
           "llamatune": ("WHATIF_LLAMATUNE_CAP_GIB", 20),
           "gpt2compilefixed": ("WHATIF_GPT2COMPILEFIXED_CAP_GIB", 15),
           "gpt2scalerfixed": ("WHATIF_GPT2SCALERFIXED_CAP_GIB", 15),
           "gpt2scalerskip": ("WHATIF_GPT2SCALERSKIP_CAP_GIB", 7),
           "gpt2scalermid": ("WHATIF_GPT2SCALERMID_CAP_GIB", 7.43),
           # The caps of the README's runs (H200, 2026-11-29; WHATIF_STEP_LIMIT=45, 45, 30).
           "segformervar": ("WHATIF_SEGFORMERVAR_CAP_GIB", 16),
           "gpt2offload": ("WHATIF_GPT2OFFLOAD_CAP_GIB", 4.6),
           "dlrmsparse": ("WHATIF_DLRMSPARSE_CAP_GIB", 14.4),
           "distill": ("WHATIF_DISTILL_CAP_GIB", 10),
           "convnextema": ("WHATIF_CONVNEXTEMA_CAP_GIB", 10),
           "whispervar": ("WHATIF_WHISPERVAR_CAP_GIB", 10),
           "hftrainerskip": ("WHATIF_HFTRAINERSKIP_CAP_GIB", 7),
           "gpt2accumfirst": ("WHATIF_GPT2ACCUMFIRST_CAP_GIB", 7),
           "gpt2accumskip": ("WHATIF_GPT2ACCUMSKIP_CAP_GIB", 7),
           "gpt2ddpaccumskip": ("WHATIF_GPT2DDPACCUMSKIP_CAP_GIB", 7.5),
           "gnnvar": ("WHATIF_GNNVAR_CAP_GIB", 10), "detrvar": ("WHATIF_DETRVAR_CAP_GIB", 10),
           "maskrcnnvar": ("WHATIF_MASKRCNNVAR_CAP_GIB", 10), "timmprog": ("WHATIF_TIMMPROG_CAP_GIB", 10),
           "gpt2finder": ("WHATIF_GPT2FINDER_CAP_GIB", 8)}
HERE = os.path.dirname(os.path.abspath(__file__))
# What a workload says of where it was when an OOM came (graphsteps, graphsonce: "before
# the capture", "capture" or "replay").
STEP_NOTE = {}
# The workloads that are torchrun jobs, and their ranks: `job` launches them itself.
RANKS = {"gpt2ddp2": 2, "gpt2fsdp2": 2, "gpt2fsdp1": 2}
STEP_LIMIT = int(os.environ.get("WHATIF_STEP_LIMIT", "400"))
# gpt2sgd: its gradients zeroed in place (p.grad.zero_()) instead of dropped.
ZERO_IN_PLACE = os.environ.get("WHATIF_SGD_ZERO_IN_PLACE") == "1"
PROFILE = os.environ.get("WHATIF_PROFILE") == "1"  # each step's peaks, printed (sizing caps)
# resnetvar's batches scaled (0.5: "half the batch", as vramtop's knobs line offers it).
BATCH_SCALE = float(os.environ.get("WHATIF_BATCH_SCALE", "1"))


BASE_CONF = os.environ.get("WHATIF_BASE_CONF", "")


def conf_for(remedy):
    """The PYTORCH_CUDA_ALLOC_CONF of a remedy's run: the job's own (BASE_CONF) with the
    remedy's settings put in (a key both name takes the remedy's value, in its place)."""
    settings = {}
    for part in (BASE_CONF, remedy_conf(remedy) or ""):
        # Commas inside [..] belong to the value (roundup_power2_divisions:[256:1,>:4]).
        for pair in filter(None, re.split(r",(?![^\[]*\])", part)):
            key, _, value = pair.partition(":")
            settings[key.strip()] = value.strip()
    return ",".join(f"{k}:{v}" for k, v in settings.items()) or None


def remedy_conf(remedy):
    if remedy == "expandable":
        return "expandable_segments:True"
    if remedy.startswith("max_split:"):
        return "max_split_size_mb:" + remedy.split(":")[1]
    if remedy.startswith("gc_threshold:"):
        return "garbage_collection_threshold:" + remedy.split(":")[1]
    if remedy.startswith("roundup:"):
        return "roundup_power2_divisions:" + remedy.split(":")[1]
    if remedy == "expandable_gc":
        return "expandable_segments:True,garbage_collection_threshold:0.6"
    return None


# ---------------------------------------------------------------- one run of a workload


def nudge_address_space():
    """WHATIF_VA_NUDGE_MB: that much device memory taken first through the CUDA driver
    (cuMemAlloc on the primary context PyTorch then uses), outside PyTorch's allocator and
    so outside its history and its cap. It moves where CUDA places PyTorch's segments and
    nothing else: a remedy whose outcome in PyTorch changes with it turns on something no
    PyTorch history holds."""
    megabytes = int(os.environ.get("WHATIF_VA_NUDGE_MB", "0") or 0)
    left = int(os.environ.get("WHATIF_GPU_FREE_MIB", "0") or 0)
    if megabytes <= 0 and left <= 0:
        return
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        sys.exit(f"nudge: no CUDA driver to take memory from ({err}); run it on the GPU machine")
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(device), 0),
               cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), cu.cuCtxSetCurrent(context),
               ):
        if rc != 0:
            sys.exit(f"nudge: CUDA driver call failed ({rc})")
    if left > 0:
        # A smaller GPU: all but `left` of what is free now (the context made above) taken.
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) != 0:
            sys.exit("gpu free: cuMemGetInfo failed")
        megabytes = (free.value >> 20) - left
        if megabytes <= 0:
            sys.exit(f"gpu free: only {free.value >> 20} MiB free, asked to leave {left}")
    rc = cu.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(megabytes << 20))
    if rc != 0:
        sys.exit(f"nudge: cuMemAlloc of {megabytes} MiB failed ({rc})")
    print(f"nudge: {megabytes} MiB at {pointer.value:#x}" + (f", {left} MiB left free" if left > 0 else ""), flush=True)


def run_job(workload, remedy, stop_at):
    nudge_address_space()
    import torch  # after PYTORCH_CUDA_ALLOC_CONF is set by the caller

    def before_judged():
        if remedy == "empty_cache":
            torch.cuda.empty_cache()
        elif remedy == "gc_collect":
            import gc

            gc.collect()

    def cap(nbytes):
        if int(os.environ.get("WHATIF_GPU_FREE_MIB", "0") or 0) > 0:
            return  # a smaller GPU stands for the cap (nudge_address_space)
        # The current device's: a rank of gpt2ddp2 runs on its own.
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(nbytes / total)

    dump = os.environ.get("WHATIF_DUMP")

    def judged(ok, **extra):
        if dump:
            # PyTorch's own history of this run, to hold a replay of it against (a study,
            # not a check: the ring this big costs the job time); a rank's, its own file.
            torch.cuda.memory._dump_snapshot(dump + (".rank" + os.environ["RANK"] if workload in RANKS else ""))
        if workload in RANKS:
            extra["rank"] = int(os.environ["RANK"])
        if workload in RANKS and os.environ.get("WHATIF_DDP_DESTROY_AT_EXIT") != "1":
            # A rank judged ends within 30 s whatever its peers do: NCCL's teardown can
            # wait on a collective a failed rank never joined, and torchrun on that rank.
            # faulthandler's watchdog is C's: it fires in the interpreter's finalization
            # too, where a Python thread could no longer run (it exits 1).
            import faulthandler

            faulthandler.dump_traceback_later(30.0, exit=True)
        print("judged: " + json.dumps(dict(workload=workload, remedy=remedy, ok=ok,
                                           reserved=torch.cuda.memory_reserved(),
                                           allocated=torch.cuda.memory_allocated(), **extra)),
              flush=True)

    def ask(nbytes):
        before_judged()
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            del t
            judged(True)
        except torch.OutOfMemoryError:
            judged(False)

    torch.cuda.init()
    if dump:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=4_000_000)
    if workload == "checker":
        torch.cuda.set_per_process_memory_fraction(0.1)
        # As many 6 MiB tensors as the plain allocator holds under the cap (three to a
        # 20 MiB segment): the count this workload reached when it allocated until its
        # first OOM. A fixed count makes every remedy's run the same job: allocating until
        # the OOM under expandable segments went on further (2,383 tensors against 2,145 on
        # an H200, whose cap is 14.0 GiB), so that run was judged on another job's state.
        allowed = int(0.1 * torch.cuda.get_device_properties(0).total_memory)
        count = allowed // (20 * MiB) * 3
        held = []
        try:
            for _ in range(count):
                held.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            # A remedy's run that cannot even hold the plain run's tensors fails the job.
            judged(False, note=f"ran out at tensor {len(held)} of {count}")
            return
        del held[::2]
        ask(GiB)
    elif workload == "splitcache":
        cap(int(7.9 * GiB))
        big = torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")
        del big
        held = [torch.empty(304 * MiB, dtype=torch.uint8, device="cuda") for _ in range(20)]
        del held[::2]
        ask(int(2.5 * GiB))
    elif workload == "tails":
        cap(2010 * MiB)
        held = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(300)]
        ask(100 * MiB)
    elif workload == "otherproc":
        ask(30 * GiB)
    elif workload in STEPPED:
        after_step = torch.cuda.empty_cache if remedy == "empty_cache_steps" else (lambda: None)
        steps(workload, cap, stop_at, judged, before_judged, after_step)


class PaddedBatches:
    """gpt2loader's dataset, made in the DataLoader's workers: batch k of `plan` (batch,
    longest) as token ids of samples of their own lengths, padded to the longest, and
    their attention mask. Seeded by k, so every run gets the same batches. At module level:
    spawned workers unpickle it by name."""

    def __init__(self, plan):
        self.plan = plan

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, k):
        import torch

        batch, longest = self.plan[k]
        g = torch.Generator().manual_seed(k)
        lengths = torch.randint(max(1, longest // 2), longest + 1, (batch,), generator=g)
        lengths[0] = longest
        ids = torch.randint(0, 50257, (batch, longest), generator=g)
        mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
        return ids * mask, mask


def varying_shape(i):
    """A GPT-2 workload's batch and sequence length at step `i`: the batch drawn from six
    sizes, the length growing with the step (gpt2sgd, gpt2scaler, gpt2stream, hftrainer)."""
    import random

    return random.choice([2, 4, 6, 8, 12, 16]), min(2048, random.randint(64, 256 + 8 * i))


def mixed_lm_step(model, opt, vocab, batches, longest_at, limit):
    """A causal LM's training step whose batch (one of `batches`) and length (64 to
    longest_at(i), at most `limit`) vary from step to step: bf16 autocast, AdamW's step,
    gradients dropped. The draws come in the same order for every workload, so a seeded
    run repeats."""
    import random

    import torch

    def step(i):
        batch = random.choice(batches)
        length = min(limit, random.randint(64, longest_at(i)))
        x = torch.randint(0, vocab, (batch, length), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def image_step(model, opt, batches, unit, most_units_at, fewest_units, bf16, **kwargs):
    """An image classifier's training step whose batch (one of `batches`) and square side
    (`unit` times fewest_units to most_units_at(i)) vary from step to step; `kwargs` go to
    the model. The draws come in the same order for every workload, so a seeded run
    repeats."""
    import contextlib
    import random

    import torch

    def step(i):
        batch = random.choice(batches)
        side = unit * random.randint(fewest_units, most_units_at(i))
        x = torch.randn(batch, 3, side, side, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        precision = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with precision:
            loss = model(pixel_values=x, labels=y, **kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def asked_of(oom):
    """PyTorch's own words for the refused request ("Tried to allocate 756.00 MiB"), or
    None: the control reproduces the OOM only where it asks the same."""
    asked = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", str(oom))
    return asked.group(1) if asked else None


def bf16_update(model, opt, **inputs):
    """One training step on `inputs`: the loss under bf16 autocast, its backward, the
    optimizer's step, the gradients dropped."""
    import torch

    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def gpt2_mixed_model():
    """gpt2mixed's GPT-2 (6 layers, 1024 wide, 2,048 positions, random weights) on the GPU:
    the model of every workload built on gpt2mixed."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=2048)).cuda()


def gpt2_fixed():
    """gpt2fixed's GPT-2 (6 layers, 1024 wide, random weights) with AdamW, and a draw of its
    one batch shape (12 x 1024): the same job under the fixed-batch workloads' variations."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, lambda: torch.randint(0, 50257, (12, 1024), device="cuda")


def llama_config(layers):
    """The harness's Llama: 1024 wide, grouped-query attention (16 heads, 4 for keys and
    values), a 32,000-token vocabulary, random weights."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                       max_position_embeddings=4096)


def llama_mix():
    """llamamix's model and step: a Llama (8 layers, 1024 wide, grouped-query attention,
    AdamW) whose batch and length vary."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config(8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, mixed_lm_step(model, opt, 32000, [1, 2, 4, 6, 8], lambda i: 192 + 16 * i, 4096)


def unet(classes, widths=(64, 128, 256, 512)):
    """unetvar's model: a U-Net whose encoder halves the side at each of len(widths) levels
    and whose decoder doubles it back, each level's output joined to the decoder's
    (skip connections); two 3x3 convolutions, group norm and SiLU a level."""
    import torch
    from torch import nn

    def block(inp, out):
        return nn.Sequential(nn.Conv2d(inp, out, 3, padding=1), nn.GroupNorm(8, out), nn.SiLU(),
                             nn.Conv2d(out, out, 3, padding=1), nn.GroupNorm(8, out), nn.SiLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            chans = [3] + list(widths)
            self.down = nn.ModuleList(block(chans[k], chans[k + 1]) for k in range(len(widths)))
            self.middle = block(widths[-1], 2 * widths[-1])
            ups = [2 * widths[-1]] + list(reversed(widths))
            self.up = nn.ModuleList(nn.ConvTranspose2d(ups[k], ups[k + 1], 2, stride=2)
                                    for k in range(len(widths)))
            self.join = nn.ModuleList(block(2 * ups[k + 1], ups[k + 1]) for k in range(len(widths)))
            self.head = nn.Conv2d(widths[0], classes, 1)

        def forward(self, x):
            skips = []
            for down in self.down:
                x = down(x)
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
            x = self.middle(x)
            for up, join in zip(self.up, self.join):
                x = join(torch.cat([up(x), skips.pop()], dim=1))
            return self.head(x)

    return UNet()


def join_the_ranks():
    """A rank of the torchrun job job_main launched (torchrun's environment says which):
    on its own GPU over NCCL, or on cuda:0 with the others over gloo where the ranks
    outnumber the GPUs; the process group joined. Returns the rank."""
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    shared = torch.cuda.device_count() < int(os.environ["LOCAL_WORLD_SIZE"])
    torch.cuda.set_device(0 if shared else local)
    dist.init_process_group("gloo" if shared else "nccl")
    return rank


def cap_from_env(cap, workload):
    name, default = CAP_ENV[workload]
    cap(int(float(os.environ.get(name, str(default))) * GiB))


def steps(workload, cap, stop_at, judged, before_judged, after_step):
    """Runs steps until an OOM (the plain run) or through step `stop_at` (a remedy run)."""
    import random

    import torch

    random.seed(1234)
    torch.manual_seed(1234)
    if workload == "gpt2var":
        from transformers import GPT2Config, GPT2LMHeadModel

        cap(6 * GiB)
        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_positions=4096)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            length = min(4096, 256 + 24 * i + random.randint(0, 256))
            x = torch.randint(0, 50257, (4, length), device="cuda")
            loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "gpt2mixed":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        step = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "gpt2loader":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # Each batch's shape drawn here, in the job's order, so a seeded run repeats
        # whichever worker makes it; the workers make the samples themselves.
        plan = [(random.choice([2, 4, 6, 8, 12, 16]), min(2048, random.randint(64, 256 + 8 * i)))
                for i in range(STEP_LIMIT)]
        loader = torch.utils.data.DataLoader(
            PaddedBatches(plan), batch_size=None, num_workers=4, pin_memory=True,
            persistent_workers=True, prefetch_factor=4,
            multiprocessing_context=os.environ.get("WHATIF_LOADER_START") or None)
        batches = iter(loader)

        def step(i):
            ids, mask = next(batches)
            ids = ids.cuda(non_blocking=True)
            mask = mask.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, attention_mask=mask,
                             labels=ids.masked_fill(mask == 0, -100)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "gpt2ddp":
        import tempfile as _tempfile

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        cap_from_env(cap, workload)
        # One rank of DistributedDataParallel over NCCL: its gradient buckets, its
        # all-reduce on NCCL's own stream (the tensors handed to it from the job's), as a
        # torchrun job's rank has them; a store of its own file, so that runs side by side
        # share nothing.
        store = dist.FileStore(_tempfile.mkstemp(prefix="whatif-ddp-")[1], 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        import atexit

        atexit.register(dist.destroy_process_group)  # NCCL warns at exit otherwise
        model = gpt2_mixed_model()
        model = DistributedDataParallel(model, device_ids=[0])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "gpt2ddp2":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        rank = join_the_ranks()
        if os.environ.get("WHATIF_DDP_DESTROY_AT_EXIT") == "1":
            # A user's `finally: dist.destroy_process_group()`, for seeing where a rank's
            # end waits (not in the A/B runs: judged's timer would cut it short).
            import atexit

            atexit.register(dist.destroy_process_group)
        cap_from_env(cap, workload)
        # Each rank its own batches (the model's weights alike); WHATIF_DDP_SWAP=1 swaps the
        # two ranks' draws, so the rank that runs out is on cuda:1 instead of cuda:0.
        swap = os.environ.get("WHATIF_DDP_SWAP") == "1"
        random.seed(1234 + (rank ^ 1 if swap else rank))
        model = gpt2_mixed_model()
        model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "gpt2fsdp2":
        from torch.distributed.fsdp import fully_shard

        # gpt2ddp2's job sharded by FSDP2 instead, as LLM fine-tuning scripts do: each
        # block and the root `fully_shard`ed, so a rank holds half the parameters, gradients
        # and AdamW state, all-gathers a block's parameters before its forward and backward
        # (on FSDP's own stream) and frees them after; gradients reduce-scattered.
        rank = join_the_ranks()
        cap_from_env(cap, workload)
        random.seed(1234 + rank)
        model = gpt2_mixed_model()
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        # What this rank holds of the parameters (their local shards, padding and all), for
        # holding vramtop's memory line to: AdamW's state is twice it once stepped.
        shards = {p._local_tensor.untyped_storage().data_ptr(): p._local_tensor.untyped_storage().nbytes()
                  for p in model.parameters()}
        print("fsdp2 rank %d: sharded parameters %d bytes" % (rank, sum(shards.values())), flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "gpt2fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        # The same job under FSDP's first form, as accelerate and the HF Trainer still set
        # it up: each block a FlatParameter unit (auto-wrapped), sharded, its unsharded
        # parameters freed by resizing their storage to 0 after use; all-gathers on FSDP's
        # own streams, gradients reduce-scattered.
        rank = join_the_ranks()
        cap_from_env(cap, workload)
        random.seed(1234 + rank)
        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=2048))
        model = FullyShardedDataParallel(
            model, device_id=torch.cuda.current_device(),
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block}))
        shards = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
        print("fsdp1 rank %d: sharded parameters %d bytes" % (rank, sum(shards.values())), flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "gpt2empties":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        update = mixed_lm_step(model, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)

        def step(i):
            update(i)
            if i % 10 == 9:
                torch.cuda.empty_cache()  # the script's own, not a remedy's
    elif workload == "gpt2sgd":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        params = [p for p in model.parameters() if p.requires_grad]
        momentum = {}

        def step(i):
            # A hand-written update, as research code has it: no torch.optim, so nothing
            # the hook marks; the momentum buffers are made in the first step and kept.
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            with torch.no_grad():
                for p in params:
                    buf = momentum.get(p)
                    if buf is None:
                        momentum[p] = buf = torch.zeros_like(p)
                    buf.mul_(0.9).add_(p.grad)
                    p.add_(buf, alpha=-1e-4)
                    if ZERO_IN_PLACE:
                        p.grad.zero_()  # as older hand-written loops do
                    else:
                        p.grad = None
    elif workload == "llamamix":
        cap_from_env(cap, workload)
        _, step = llama_mix()
    elif workload == "gpt2ckpt":
        from transformers import GPT2Config, GPT2LMHeadModel

        cap_from_env(cap, workload)
        model = GPT2LMHeadModel(GPT2Config(n_layer=8, n_embd=1024, n_head=16, n_positions=4096,
                                           use_cache=False)).cuda()
        # Activation checkpointing: each block's activations are made again in the
        # backward, so a step's memory peaks there, not at the forward's end.
        model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        step = mixed_lm_step(model, opt, 50257, [2, 4, 8, 12, 16], lambda i: 256 + 24 * i, 4096)
    elif workload == "evalmix":
        cap_from_env(cap, workload)
        model, train = llama_mix()

        def step(i):
            # Every fifth step an evaluation first, as trainers do: larger batches under
            # no_grad, no optimizer step (so it falls in the next training step's marks).
            if i % 5 == 4:
                model.eval()
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                    for _ in range(2):
                        length = min(4096, random.randint(128, 192 + 16 * i))
                        x = torch.randint(0, 32000, (12, length), device="cuda")
                        model(x, labels=x).loss.item()
                model.train()
            train(i)
    elif workload == "gpt2keep":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        kept = []

        def step(i):
            # A leak users write: each step's last hidden states kept "for metrics"
            # (detached, so no graph, but never freed), while the shapes vary.
            batch = random.choice([2, 4, 8, 12])
            length = min(2048, random.randint(64, 256 + 8 * i))
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x, labels=x, output_hidden_states=True)
            out.loss.backward()
            kept.append(out.hidden_states[-1].detach())
            del out
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "gan":
        import torch.nn as nn

        cap_from_env(cap, workload)
        width = 256

        def block(cin, cout, up):
            conv = (nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False) if up
                    else nn.Conv2d(cin, cout, 4, 2, 1, bias=False))
            return [conv, nn.BatchNorm2d(cout), nn.ReLU(True) if up else nn.LeakyReLU(0.2, True)]

        gen = nn.Sequential(nn.ConvTranspose2d(128, width * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(width * 8),
                            nn.ReLU(True), *block(width * 8, width * 4, True), *block(width * 4, width * 2, True),
                            *block(width * 2, width, True), nn.ConvTranspose2d(width, 3, 4, 2, 1), nn.Tanh()).cuda()
        disc = nn.Sequential(nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2, True), *block(width, width * 2, False),
                             *block(width * 2, width * 4, False), *block(width * 4, width * 8, False),
                             nn.Conv2d(width * 8, 1, 4, 1, 0)).cuda()
        opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
        bce = nn.BCEWithLogitsLoss()

        def step(i):
            # Two optimizers, so two steps marked an iteration, each with its own pattern
            # (the discriminator's, then the generator's); the batch varies and grows.
            batch = random.choice([32, 64, 96, 128]) * min(4, 1 + i // 25)
            real = torch.randn(batch, 3, 64, 64, device="cuda")
            z = torch.randn(batch, 128, 1, 1, device="cuda")
            fake = gen(z)
            loss_d = (bce(disc(real).flatten(), torch.ones(batch, device="cuda"))
                      + bce(disc(fake.detach()).flatten(), torch.zeros(batch, device="cuda")))
            loss_d.backward()
            opt_d.step()
            opt_d.zero_grad(set_to_none=True)
            loss_g = bce(disc(fake).flatten(), torch.ones(batch, device="cuda"))
            loss_g.backward()
            opt_g.step()
            opt_g.zero_grad(set_to_none=True)
    elif workload == "moemix":
        from transformers import MixtralConfig, MixtralForCausalLM

        cap_from_env(cap, workload)
        config = MixtralConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                               num_attention_heads=12, num_key_value_heads=4, num_local_experts=8,
                               num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=4096)
        model = MixtralForCausalLM(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        # A sparse mixture of experts: how many tokens each expert gets is the router's
        # choice, so the sizes inside a step vary even between steps of one shape.
        step = mixed_lm_step(model, opt, 32000, [2, 4, 6, 8], lambda i: 256 + 16 * i, 4096)
    elif workload in ("gpt2scaler", "gpt2scalerskip", "gpt2scalermid", "gpt2accumskip", "gpt2ddpaccumskip"):
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        if workload == "gpt2ddpaccumskip":
            import atexit
            import tempfile as _tempfile

            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            # gpt2ddp's one rank; no no_sync(): every micro-batch is all-reduced.
            store = dist.FileStore(_tempfile.mkstemp(prefix="whatif-ddp-")[1], 1)
            dist.init_process_group("nccl", store=store, rank=0, world_size=1)
            atexit.register(dist.destroy_process_group)
            model = DistributedDataParallel(model, device_ids=[0])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # fp16 needs loss scaling; a scale grown every 8 clean steps overflows now and then,
        # and GradScaler then skips the optimizer's step: no step is marked for it.
        # gpt2scalerskip and gpt2accumskip: the scale starts at 2**40, so the first steps
        # overflow and are all skipped, none marked; gpt2accumskip accumulates two
        # micro-batches of varying shape a step (the hook marks the passes after zero_grad()).
        init = 2.0 ** (16 if workload in ("gpt2scaler", "gpt2scalermid") else 40)
        scaler = torch.amp.GradScaler("cuda", init_scale=init, growth_interval=8)
        micro = 2 if workload in ("gpt2accumskip", "gpt2ddpaccumskip") else 1

        def step(i):
            for j in range(micro):
                batch, length = varying_shape(micro * i + j)
                x = torch.randint(0, 50257, (batch, length), device="cuda")
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x, labels=x).loss / micro
                scaler.scale(loss).backward()
            if workload == "gpt2scalermid" and i % 4 == 2:
                # An overflow in the middle of the run: GradScaler skips this step.
                next(p for p in model.parameters() if p.grad is not None).grad.fill_(float("inf"))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    elif workload == "loramix":
        import torch.nn as nn

        cap_from_env(cap, workload)
        model, _ = llama_mix()

        class Lora(nn.Module):
            """A frozen projection plus a trained low-rank update (B starts at zero)."""

            def __init__(self, base, rank=16):
                super().__init__()
                self.base = base
                self.a = nn.Parameter(torch.randn(rank, base.in_features, device="cuda") / rank)
                self.b = nn.Parameter(torch.zeros(base.out_features, rank, device="cuda"))

            def forward(self, x):
                return self.base(x) + (x @ self.a.t()) @ self.b.t()

        model.requires_grad_(False)
        for layer in model.model.layers:
            for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                  (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
                for name in names:
                    setattr(parent, name, Lora(getattr(parent, name)))
        adapters = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(adapters, lr=1e-4)
        step = mixed_lm_step(model, opt, 32000, [2, 4, 8, 12, 16], lambda i: 256 + 24 * i, 4096)
    elif workload == "gpt2compile":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        compiled = torch.compile(model, dynamic=True)
        step = mixed_lm_step(compiled, opt, 50257, [2, 4, 6, 8, 12, 16], lambda i: 256 + 8 * i, 2048)
    elif workload == "llamagen":
        cap_from_env(cap, workload)
        model, _ = llama_mix()
        model.eval()
        model.generation_config.pad_token_id = 0

        def step(i):
            # Serving batches: more prompts, longer, more new tokens as it goes.
            batch = random.choice([4, 8, 16, 24, 32])
            length = random.randint(64, 128 + 32 * i)
            x = torch.randint(1, 32000, (batch, length), device="cuda")
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=random.randint(8, 32 + 2 * i), min_new_tokens=1)
    elif workload == "gpt2stream":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        side = torch.cuda.Stream()

        def step(i):
            # The batch made on a side stream, as a prefetching loader does, then handed
            # to the default stream: its blocks come from the side stream's pool.
            batch, length = varying_shape(i)
            with torch.cuda.stream(side):
                embeds = torch.randn(batch, length, 1024, device="cuda", dtype=torch.bfloat16)
                labels = torch.randint(0, 50257, (batch, length), device="cuda")
            main = torch.cuda.current_stream()
            main.wait_stream(side)
            embeds.record_stream(main)
            labels.record_stream(main)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(inputs_embeds=embeds, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload in ("t5beam", "t5beam_steps"):
        from transformers import T5Config, T5ForConditionalGeneration

        cap_from_env(cap, workload)
        model = T5ForConditionalGeneration(T5Config(d_model=512, d_ff=2048, num_layers=6,
                                                    num_heads=8, vocab_size=32128, pad_token_id=0,
                                                    decoder_start_token_id=0, eos_token_id=1)).cuda()
        model.eval()

        def step(i):
            batch = random.choice([4, 8, 16, 24])
            source = random.randint(32, 64 + 24 * i)
            x = torch.randint(2, 32128, (batch, source), device="cuda")
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                model.generate(x, attention_mask=torch.ones_like(x), num_beams=4, do_sample=False,
                               max_new_tokens=random.randint(8, 24 + i), min_new_tokens=1)
            mark()

        mark = lambda: None  # noqa: E731
        if workload == "t5beam_steps":
            sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
            import vramtop

            mark = vramtop.step
    elif workload == "wav2vec":
        from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

        cap_from_env(cap, workload)
        model = Wav2Vec2ForCTC(Wav2Vec2Config(vocab_size=32, pad_token_id=0,
                                              ctc_loss_reduction="mean")).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # Speech: the batch's clips are padded to its longest, lengths grow; CTC's
            # targets (characters) are a tenth of the model's frames (20 ms each).
            batch = random.choice([4, 8, 12, 16])
            samples = 16000 * random.randint(1, min(30, 4 + i // 3))
            x = torch.randn(batch, samples, device="cuda")
            frames = samples // 320
            y = torch.randint(1, 32, (batch, max(1, frames // 10)), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_values=x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "mambaslow":
        from transformers import MambaConfig, MambaForCausalLM

        cap_from_env(cap, workload)
        model = MambaForCausalLM(MambaConfig(hidden_size=768, num_hidden_layers=8, state_size=16,
                                             vocab_size=32000, use_mambapy=False)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # transformers' slow path (no mamba-ssm here) runs the selective scan token by
        # token in Python: a few small allocations per token and layer, both ways.
        step = mixed_lm_step(model, opt, 32000, [2, 4, 8, 12], lambda i: 64 + 4 * i, 512)
    elif workload in ("hftrainer", "hftrainerskip"):
        import tempfile

        from transformers import Trainer, TrainingArguments

        cap_from_env(cap, workload)
        skip = workload == "hftrainerskip"
        model = gpt2_mixed_model()
        trainer = Trainer(model=model, args=TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="whatif-trainer-"), bf16=not skip, fp16=skip,
            max_grad_norm=1.0, learning_rate=1e-4, report_to=[], save_strategy="no",
            logging_strategy="no"))
        trainer.create_optimizer_and_scheduler(num_training_steps=STEP_LIMIT)
        if skip:
            # hftrainerskip: fp16, accelerate's GradScaler starting at 2**40, so its first
            # steps overflow and are skipped (taken by the optimizer's wrapper at prepare).
            trainer.accelerator.scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)
        # As Trainer's inner loop does: accelerate wraps the model's forward in bf16
        # autocast and the optimizer in its AcceleratedOptimizer.
        model, trainer.optimizer = trainer.accelerator.prepare(model, trainer.optimizer)
        trainer.model_wrapped = model
        trainer.current_gradient_accumulation_steps = 1
        model.train()

        def step(i):
            # What Trainer's inner loop does each step: its training_step (autocast and
            # accelerate's backward), clipping through accelerate, the wrapped optimizer's
            # step (the hook's mark), the schedule, gradients dropped.
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            trainer.training_step(model, {"input_ids": x, "labels": x})
            trainer.accelerator.clip_grad_norm_(model.parameters(), 1.0)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad(set_to_none=True)
    elif workload == "llamafixed":
        from transformers import LlamaForCausalLM

        cap_from_env(cap, workload)
        model = LlamaForCausalLM(llama_config(8)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            x = torch.randint(0, 32000, (8, 1024), device="cuda")
            bf16_update(model, opt, input_ids=x, labels=x)
    elif workload == "llamatune":
        from transformers import LlamaConfig, LlamaForCausalLM

        cap_from_env(cap, workload)
        config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                             num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                             max_position_embeddings=4096)
        model = LlamaForCausalLM(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)

        def step(i):
            x = torch.randint(0, 32000, (8, 1024), device="cuda")
            bf16_update(model, opt, input_ids=x, labels=x)
    elif workload == "gpt2fixed":
        cap_from_env(cap, workload)
        model, opt, batch = gpt2_fixed()

        def step(i):
            # Every batch the same shape: what fits once fits again, unless the memory
            # the first step leaves behind (AdamW's state) is what the batch lacked.
            x = batch()
            bf16_update(model, opt, input_ids=x, labels=x)
    elif workload == "gpt2compilefixed":
        cap_from_env(cap, workload)
        model, opt, batch = gpt2_fixed()
        if os.environ.get("WHATIF_COMPILE_IN_PLACE") == "1":
            model.compile()  # Module.compile: the module's own call compiled, hooks and all
            compiled = model
        else:
            compiled = torch.compile(model)

        # WHATIF_COMPILE_EAGER_ROOT=1: an eager root module runs too each step (a loss or
        # metric module): the hook's watch notes it, not the compiled model, and its second
        # call ends the watch (a recompile of the model until hook 1.16, stop 65).
        eager = torch.nn.Identity() if os.environ.get("WHATIF_COMPILE_EAGER_ROOT") == "1" else None

        def step(i):
            x = batch()
            bf16_update(compiled, opt, input_ids=x, labels=x)
            if eager is not None:
                eager(x)
    elif workload == "gpt2scalerfixed":
        cap_from_env(cap, workload)
        model, opt, batch = gpt2_fixed()
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)

        def step(i):
            x = batch()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(input_ids=x, labels=x).loss
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped while the scaled gradients overflow
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if PROFILE:
                print(f"profile: step {i} scale {scaler.get_scale()}", flush=True)
    elif workload == "gpt2accumfirst":
        cap_from_env(cap, workload)
        model, opt, _ = gpt2_fixed()
        micro = [2, 3, 4, 5, 6, 7, 8, 9]

        def step(i):
            # Gradients accumulated over 8 micro-batches, each larger than the last, before
            # AdamW's step: capped to run out inside the first step, no step has ended.
            for j, b in enumerate(micro):
                x = torch.randint(0, 50257, (b, 1024), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=x, labels=x).loss / len(micro)
                loss.backward()
                if PROFILE:
                    print(f"profile: micro {i}.{j} peak_allocated {torch.cuda.max_memory_allocated()} "
                          f"peak_reserved {torch.cuda.max_memory_reserved()}", flush=True)
                    torch.cuda.reset_peak_memory_stats()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "clipvar":
        from transformers import CLIPConfig, CLIPModel

        cap_from_env(cap, workload)
        model = CLIPModel(CLIPConfig(text_config={"max_position_embeddings": 77},
                                     vision_config={"image_size": 224, "patch_size": 16})).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # Contrastive: images and captions in pairs, the batch growing (the logits
            # are batch x batch), captions padded to the batch's longest.
            batch = 16 * random.randint(2, min(32, 4 + i // 2))
            length = random.randint(8, 77)
            ids = torch.randint(0, 49408, (batch, length), device="cuda")
            pixels = torch.randn(batch, 3, 224, 224, device="cuda")
            bf16_update(model, opt, input_ids=ids, pixel_values=pixels, return_loss=True)
    elif workload in ("lightning", "lightningaccum"):
        return lightning_steps(workload, cap, stop_at, judged, before_judged, after_step)
    elif workload == "gpt2tutorial":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # PyTorch's tutorial order: the last step's gradients are dropped here, at
            # the start, so they are live at every step's boundary.
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
    elif workload == "gpt2fused":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEP_LIMIT)

        def step(i):
            # Older code's habits: the gradients zeroed in place, never freed (they stay
            # allocated from the first backward on), AdamW's fused kernel, clipping, a
            # schedule.
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            opt.zero_grad(set_to_none=False)
    elif workload == "accelaccum":
        from accelerate import Accelerator
        from transformers import LlamaForCausalLM

        cap_from_env(cap, workload)
        config = llama_config(6)
        # Eager attention: the scores are batch x heads x length x length, so a step's
        # memory grows as the square of its length.
        config._attn_implementation = "eager"
        accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
        model = LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # The batches a DataLoader hands over: token ids on the host, shapes varying, the
        # longest growing; accelerate's loader moves each to the GPU.
        shapes = [(random.choice([2, 4, 6, 8]), random.randint(64, min(2048, 192 + 16 * (k // 2))))
                  for k in range(2 * STEP_LIMIT)]
        loader = torch.utils.data.DataLoader([torch.randint(0, 32000, s) for s in shapes],
                                             batch_size=None)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        batches = iter(loader)
        model.train()

        def step(i):
            # Two micro-batches, accelerate's way: accumulate() decides whether the
            # wrapped optimizer really steps (the hook's mark), backward() scales the loss.
            for _ in range(2):
                x = next(batches)
                with accelerator.accumulate(model):
                    loss = model(input_ids=x, labels=x).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    elif workload == "llamabf16":
        from transformers import LlamaForCausalLM

        cap_from_env(cap, workload)
        config = llama_config(8)
        config.use_cache = False
        # Pure bf16: the weights themselves, so their gradients and AdamW's two states too;
        # no autocast, no fp32 master copy.
        model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(i):
            batch = random.choice([1, 2, 4, 6, 8])
            length = min(4096, random.randint(64, 256 + 32 * i))
            x = torch.randint(0, 32000, (batch, length), device="cuda")
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "unetvar":
        cap_from_env(cap, workload)
        model = unet(21).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # Segmentation: a class per pixel. Batch and side vary, the largest side grows.
            batch = random.choice([4, 8, 12, 16])
            side = 32 * random.randint(4, min(16, 6 + i // 5))
            x = torch.randn(batch, 3, side, side, device="cuda")
            y = torch.randint(0, 21, (batch, side, side), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload in ("graphsteps", "graphsonce"):
        cap_from_env(cap, workload)
        width = 2048
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                          torch.nn.Linear(4 * width, width))
                                      for _ in range(6)], torch.nn.Linear(width, 1000)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
        graphs = {}

        def captured(batch):
            # PyTorch's whole-network capture: warmed up on a side stream (lazy
            # initialisation, the optimizer's state), then one step captured; its inputs
            # are static tensors, refilled before each replay. graphsonce warms up once, at
            # its first batch size, as a job warmed up once does: a new size's first
            # activations and gradients are then made during its capture, into its pool,
            # so an OOM there is raised inside the capture.
            STEP_NOTE["phase"] = "before the capture"
            x = torch.randn(batch, width, device="cuda")
            y = torch.randint(0, 1000, (batch,), device="cuda")
            if workload == "graphsteps" or not graphs:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        opt.zero_grad(set_to_none=True)
                        torch.nn.functional.cross_entropy(model(x), y).backward()
                        opt.step()
                torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            STEP_NOTE["phase"] = "capture"
            with torch.cuda.graph(graph):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            STEP_NOTE["phase"] = "replay"
            return graph, x, y

        def step(i):
            batch = 256 * random.randint(1, min(16, 2 + i // 3))
            if batch not in graphs:
                graphs[batch] = captured(batch)
            graph, x, y = graphs[batch]
            x.normal_()
            y.random_(0, 1000)
            graph.replay()
    elif workload == "llamagraphs":
        from transformers import LlamaForCausalLM

        cap_from_env(cap, workload)
        model = LlamaForCausalLM(llama_config(6)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        # torch.compile's CUDA graphs over a Llama, the whole step's backward in them too;
        # batch and length from a few buckets, as padded fine-tuning data comes.
        compiled = torch.compile(model, mode="reduce-overhead")

        def step(i):
            batch = random.choice([2, 4, 8])
            length = 256 * random.randint(1, min(12, 2 + i // 4))
            x = torch.randint(0, 32000, (batch, length), device="cuda")
            torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compiled(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "gpt2graphs":
        cap_from_env(cap, workload)
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # torch.compile's CUDA graphs (cudagraph trees): each new shape is run once in the
        # trees' own pool, then recorded there, and replayed after; the optimizer eager.
        compiled = torch.compile(model, mode="reduce-overhead")

        def step(i):
            batch = random.choice([4, 8])
            length = 128 * random.randint(1, min(16, 2 + i // 3))  # lengths padded to buckets
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compiled(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "vitvar":
        from transformers import ViTConfig, ViTForImageClassification

        cap_from_env(cap, workload)
        model = ViTForImageClassification(ViTConfig(image_size=224, num_labels=1000)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        # A ViT-Base whose batch and resolution vary (the position embeddings
        # interpolated), the largest resolution growing: tokens grow as its square.
        step = image_step(model, opt, [16, 32, 48, 64], 16, lambda i: min(28, 8 + i // 4), 8,
                          bf16=True, interpolate_pos_encoding=True)
    elif workload == "segformervar":
        import random

        from transformers import SegformerConfig, SegformerForSemanticSegmentation

        cap_from_env(cap, workload)
        # A SegFormer (MiT-b0 encoder, all-MLP decoder, random weights) trained for semantic
        # segmentation of 150 classes: batch and square side vary, the largest side growing;
        # its logits are upsampled to the masks' size for the loss.
        model = SegformerForSemanticSegmentation(SegformerConfig(num_labels=150)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            batch = random.choice([4, 8, 12, 16])
            side = 32 * random.randint(8, min(20, 8 + i // 3))
            x = torch.randn(batch, 3, side, side, device="cuda")
            masks = torch.randint(0, 150, (batch, side, side), device="cuda")
            bf16_update(model, opt, pixel_values=x, labels=masks)
    elif workload == "dlrmsparse":
        import random

        import torch.nn as nn

        cap_from_env(cap, workload)
        # A recommendation model: 8 embedding tables of 2M rows x 64 looked up in bags whose
        # size varies, with sparse gradients (SparseAdam, its state dense), and an MLP over
        # their concatenation (Adam): each step's gradients are as large as the rows it
        # touched, and two optimizers step in turn.
        tables = nn.ModuleList([nn.EmbeddingBag(2_000_000, 64, mode="sum", sparse=True)
                                for _ in range(8)]).cuda()
        mlp = nn.Sequential(nn.Linear(8 * 64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                            nn.Linear(1024, 1)).cuda()
        sparse_opt = torch.optim.SparseAdam(list(tables.parameters()), lr=1e-3)
        dense_opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)

        def step(i):
            batch = random.choice([2048, 4096, 8192, 16384])
            bag = random.randint(8, min(64, 8 + 2 * i))
            offsets = torch.arange(0, batch * bag, bag, device="cuda")
            feats = [t(torch.randint(0, 2_000_000, (batch * bag,), device="cuda"), offsets) for t in tables]
            y = torch.rand(batch, 1, device="cuda")
            loss = nn.functional.binary_cross_entropy_with_logits(mlp(torch.cat(feats, 1)), y)
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
            sparse_opt.zero_grad(set_to_none=True)
            dense_opt.zero_grad(set_to_none=True)
    elif workload == "distill":
        from transformers import GPT2Config, GPT2LMHeadModel

        cap_from_env(cap, workload)
        # Knowledge distillation as its tutorials write it: a larger teacher, frozen, in bf16
        # and eval under no_grad; the student trained on the cross-entropy and the KL
        # divergence from the teacher's logits softened by a temperature. The teacher's
        # logits (batch x length x 50,257) live until the student's backward has used them.
        teacher = GPT2LMHeadModel(GPT2Config(n_layer=8, n_embd=1024, n_head=16, n_positions=2048))
        teacher = teacher.to(device="cuda", dtype=torch.bfloat16).eval().requires_grad_(False)
        student = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=768, n_head=12, n_positions=2048)).cuda()
        opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
        temperature = 2.0

        def step(i):
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.no_grad():
                soft = teacher(x).logits
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = student(x, labels=x)
                kl = torch.nn.functional.kl_div(
                    torch.log_softmax(out.logits.float() / temperature, -1),
                    torch.log_softmax(soft.float() / temperature, -1),
                    log_target=True, reduction="batchmean") * temperature ** 2
                loss = 0.5 * out.loss + 0.5 * kl
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "convnextema":
        import math
        import random

        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        from transformers import ConvNextConfig, ConvNextForImageClassification

        cap_from_env(cap, workload)
        # A vision recipe's loop: ConvNeXt-Tiny trained at multiple scales (the batch
        # smaller where the side is larger, as scale schedules do, the largest side
        # growing), bf16 autocast, AdamW, clipping, a cosine schedule, and an EMA of the
        # weights updated after each step (AveragedModel: a copy of the model, updated by
        # foreach lerps).
        model = ConvNextForImageClassification(ConvNextConfig(num_labels=1000)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda k: 0.5 * (1 + math.cos(math.pi * min(k, 1000) / 1000)))
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))

        def step(i):
            side = 32 * random.randint(5, min(12, 5 + i // 3))
            batch = random.choice([16, 32, 48, 64]) if side <= 256 else random.choice([16, 24, 32, 48])
            x = torch.randn(batch, 3, side, side, device="cuda")
            y = torch.randint(0, 1000, (batch,), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(pixel_values=x, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            ema.update_parameters(model)
    elif workload == "whispervar":
        import random

        from transformers import WhisperConfig, WhisperForConditionalGeneration

        cap_from_env(cap, workload)
        # Speech recognition as its fine-tuning scripts train it: every sample 30 s of
        # log-mel features (the encoder's length fixed), the batch and the transcripts'
        # padded length varying, the longest growing.
        model = WhisperForConditionalGeneration(WhisperConfig(
            d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            batch = random.choice([4, 8, 12, 16, 24, 32])
            length = random.randint(16, min(448, 64 + 8 * i))
            feats = torch.randn(batch, 80, 3000, device="cuda")
            labels = torch.randint(0, 51865, (batch, length), device="cuda")
            bf16_update(model, opt, input_features=feats, labels=labels)
    elif workload == "gnnvar":
        import random

        cap_from_env(cap, workload)

        # Graph learning as PyG's neighbour-sampled loaders hand it: each batch a graph of
        # its own size, so no two steps allocate alike. Each layer gathers its messages
        # along the edges (E x 512), sums them into their targets and drops them.
        class Sage(torch.nn.Module):
            def __init__(self, width):
                super().__init__()
                self.own = torch.nn.Linear(width, width)
                self.neighbours = torch.nn.Linear(width, width)
                self.norm = torch.nn.LayerNorm(width)

            def forward(self, h, src, dst, inv_degree):
                summed = torch.zeros_like(h).index_add_(0, dst, h.index_select(0, src))
                return h + torch.relu(self.norm(self.own(h) + self.neighbours(summed * inv_degree)))

        class Gnn(torch.nn.Module):
            def __init__(self, features=256, width=512, layers=4, classes=64):
                super().__init__()
                self.embed = torch.nn.Linear(features, width)
                self.layers = torch.nn.ModuleList(Sage(width) for _ in range(layers))
                self.head = torch.nn.Linear(width, classes)

            def forward(self, x, src, dst, inv_degree, labels):
                h = self.embed(x)
                for layer in self.layers:
                    h = layer(h, src, dst, inv_degree)
                return torch.nn.functional.cross_entropy(self.head(h).float(), labels)

        model = Gnn().cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i):
            nodes = random.randint(20_000, 60_000 + 4_000 * i)
            edges = nodes * random.randint(4, 24) + random.randint(0, 999)
            x = torch.randn(nodes, 256, device="cuda")
            src = torch.randint(0, nodes, (edges,), device="cuda")
            dst = torch.randint(0, nodes, (edges,), device="cuda")
            inv_degree = (1.0 / torch.bincount(dst, minlength=nodes).clamp_(min=1)).unsqueeze(1)
            labels = torch.randint(0, 64, (nodes,), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, src, dst, inv_degree, labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "detrvar":
        import random

        from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

        cap_from_env(cap, workload)
        # DETR as its recipe trains it: images of their own sizes (each side 480 to 1,333,
        # multi-scale augmentation) padded to the batch's largest with a pixel mask, a
        # varying count of boxes each, the Hungarian matcher's losses (scipy), AdamW and
        # clipping at 0.1. No download: the backbone is transformers' own ResNet-50.
        config = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                            backbone=None, backbone_config=ResNetConfig(out_features=["stage4"]),
                            num_labels=91)
        model = DetrForObjectDetection(config).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)

        def step(i):
            batch = random.randint(2, 8)
            sides = [(random.randint(480, 1333), random.randint(480, 1333)) for _ in range(batch)]
            height, width = max(h for h, _ in sides), max(w for _, w in sides)
            pixels = torch.zeros(batch, 3, height, width, device="cuda")
            mask = torch.zeros(batch, height, width, dtype=torch.long, device="cuda")
            labels = []
            for k, (h, w) in enumerate(sides):
                pixels[k, :, :h, :w] = torch.randn(3, h, w, device="cuda")
                mask[k, :h, :w] = 1
                boxes = random.randint(1, 40)
                centres = torch.rand(boxes, 2, device="cuda") * 0.8 + 0.1
                extents = torch.rand(boxes, 2, device="cuda") * 0.2 + 0.02
                labels.append({"class_labels": torch.randint(0, 91, (boxes,), device="cuda"),
                               "boxes": torch.cat([centres, extents], dim=1)})
            loss = model(pixel_values=pixels, pixel_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "maskrcnnvar":
        import random

        import torchvision

        cap_from_env(cap, workload)
        # torchvision's detection reference (train.py --amp): Mask R-CNN, SGD with momentum,
        # fp16 autocast and a GradScaler (which skips the first steps while its scale is
        # too large), images of their own sizes, objects with boxes and masks.
        model = torchvision.models.detection.maskrcnn_resnet50_fpn(
            weights=None, weights_backbone=None, num_classes=91).cuda()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.02,
                              momentum=0.9, weight_decay=1e-4)
        scaler = torch.amp.GradScaler("cuda")

        def target(height, width):
            count = random.randint(1, 60)
            boxes, masks = [], torch.zeros(count, height, width, dtype=torch.uint8)
            for k in range(count):
                x0, y0 = random.randint(0, width // 2), random.randint(0, height // 2)
                x1, y1 = random.randint(x0 + 8, width), random.randint(y0 + 8, height)
                boxes.append([x0, y0, x1, y1])
                masks[k, y0:y1, x0:x1] = 1
            return {"boxes": torch.tensor(boxes, dtype=torch.float32, device="cuda"),
                    "labels": torch.randint(1, 91, (count,), device="cuda"),
                    "masks": masks.cuda()}

        def step(i):
            sides = [(random.randint(320, 1024), random.randint(320, 1024))
                     for _ in range(random.randint(2, 8))]
            images = [torch.rand(3, h, w, device="cuda") for h, w in sides]
            targets = [target(h, w) for h, w in sides]
            with torch.autocast("cuda", dtype=torch.float16):
                losses = model(images, targets)
                loss = sum(losses.values())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    elif workload == "timmprog":
        import random

        import timm
        from timm.utils import ModelEmaV3

        cap_from_env(cap, workload)
        # Progressive resizing (as FFCV's and timm's fast recipes train): small images first,
        # the side growing over the run, each step's a little off the ramp; channels_last,
        # bf16, cuDNN's benchmark (its trial workspaces), an EMA updated after each step.
        torch.backends.cudnn.benchmark = True
        model = timm.create_model("efficientnet_b2", pretrained=False, num_classes=1000,
                                  drop_path_rate=0.1).cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        ema = ModelEmaV3(model, decay=0.9998)

        def step(i):
            side = min(320, 128 + 8 * i) + random.choice([-32, -16, 0, 16])
            batch = random.choice([96, 128, 160]) if side <= 224 else random.choice([64, 80, 96])
            x = torch.randn(batch, 3, side, side, device="cuda").to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (batch,), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema.update(model, step=i)
    elif workload == "gpt2finder":
        import gc
        import random

        cap_from_env(cap, workload)
        # The batch is whatever got through the finder: a job given the memory it was
        # refused there trains at a larger one from then on.
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        found = {"batch": 64}
        while found["batch"] > 1:
            try:
                x = torch.randint(0, 50257, (found["batch"], 1024), device="cuda")
                bf16_update(model, opt, input_ids=x, labels=x)
                break
            except torch.OutOfMemoryError:
                x = None
                opt.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()
                found["batch"] //= 2
        print(f"finder: batch {found['batch']}", flush=True)

        def step(i):
            length = min(2048, random.randint(256, 512 + 16 * i))
            x = torch.randint(0, 50257, (found["batch"], length), device="cuda")
            bf16_update(model, opt, input_ids=x, labels=x)
    elif workload == "gpt2offload":
        cap_from_env(cap, workload)
        # gpt2scaler's GPT-2 in bf16 with its saved activations offloaded to pinned host
        # memory (torch.autograd.graph.save_on_cpu): each is copied out in the forward and
        # back in the backward, so the device holds fewer of them, and more copies.
        model = gpt2_mixed_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            batch, length = varying_shape(i)
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "vitfixed":
        from transformers import ViTConfig, ViTForImageClassification

        cap_from_env(cap, workload)
        model = ViTForImageClassification(ViTConfig(image_size=224, num_labels=1000)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = image_step(model, opt, [128], 16, lambda i: 14, 14, bf16=True)
    elif workload == "resnetfixed":
        from transformers import ResNetConfig, ResNetForImageClassification

        cap_from_env(cap, workload)
        torch.backends.cudnn.benchmark = True
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000)).cuda()
        model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        scaler = torch.amp.GradScaler("cuda")

        def step(i):
            x = torch.randn(192, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (192,), device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(pixel_values=x, labels=y).loss
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped where the scaled gradients overflowed: no mark
            scaler.update()
            opt.zero_grad(set_to_none=True)
    elif workload == "bertfixed":
        from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

        cap_from_env(cap, workload)
        model = BertForMaskedLM(BertConfig()).cuda()  # BERT-Base, random weights
        opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
        schedule = get_linear_schedule_with_warmup(opt, 10, 1000)

        def step(i):
            x = torch.randint(0, 30522, (32, 512), device="cuda")
            labels = torch.where(torch.rand(32, 512, device="cuda") < 0.15, x, -100)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            opt.zero_grad()
    elif workload == "resnetvar":
        from transformers import ResNetConfig, ResNetForImageClassification

        cap_from_env(cap, workload)
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000)).cuda()  # ResNet-50
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        # fp32 (TF32 convolutions), no autocast: cuDNN's workspaces come and go with each
        # shape; batch and resolution vary, the largest resolution grows.
        batches = [int(b * BATCH_SCALE) for b in [8, 16, 24, 32]]
        step = image_step(model, opt, batches, 32, lambda i: min(12, 4 + i // 8), 4, bf16=False)
    elif workload == "resnetinfer":
        from transformers import ResNetConfig, ResNetForImageClassification

        cap_from_env(cap, workload)
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000)).cuda().eval()

        def step(i):
            # Serving images: batches and resolutions vary, the largest grows; the labels
            # are taken off the GPU each batch, as a classifier's caller does.
            batch = random.choice([32, 64, 96, 128])
            side = 32 * random.randint(4, min(16, 4 + i // 4))
            x = torch.randn(batch, 3, side, side, device="cuda")
            with torch.no_grad():
                model(pixel_values=x).logits.argmax(-1).cpu()
    elif workload == "bertaccum":
        from transformers import BertConfig, BertForMaskedLM

        cap_from_env(cap, workload)
        model = BertForMaskedLM(BertConfig(num_hidden_layers=6, max_position_embeddings=1024)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # Gradient accumulation: four micro-batches of their own shape, one optimizer
            # step (the step the hook marks); gradients live across the micro-batches.
            for _ in range(4):
                batch = random.choice([4, 8, 12, 16])
                length = random.randint(32, min(1024, 96 + 16 * i))
                x = torch.randint(0, 30522, (batch, length), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=x, labels=x).loss / 4
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif workload == "t5var":
        from transformers import T5Config, T5ForConditionalGeneration

        cap_from_env(cap, workload)
        model = T5ForConditionalGeneration(T5Config(d_model=512, d_ff=2048, num_layers=6,
                                                    num_heads=8, vocab_size=32128, pad_token_id=0,
                                                    decoder_start_token_id=0)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            # An encoder-decoder: source and target lengths vary apart, both growing.
            batch = random.choice([8, 16, 24, 32])
            source = random.randint(64, min(1024, 128 + 8 * i))
            target = random.randint(16, min(256, 32 + 2 * i))
            x = torch.randint(0, 32128, (batch, source), device="cuda")
            y = torch.randint(0, 32128, (batch, target), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        cap(4 * GiB)
        layers, heads, dim = 24, 32, 128
        cache = [[torch.empty(1, heads, 0, dim, device="cuda", dtype=torch.float16)
                  for _ in range(2)] for _ in range(layers)]

        mark = lambda: None  # noqa: E731
        if workload == "kvcache_steps":
            # The user's way: the package from the wheel (here the repository's copy).
            sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
            import vramtop

            mark = vramtop.step

        def step(i):
            new = 64 + random.randint(0, 128)
            for kv in cache:
                for j in range(2):
                    x = torch.randn(1, heads, new, dim, device="cuda", dtype=torch.float16)
                    kv[j] = torch.cat([kv[j], x], dim=2)
            mark()

    for i in range(STEP_LIMIT):
        if stop_at is not None and i == stop_at:
            before_judged()
        try:
            step(i)
        except torch.OutOfMemoryError as e:
            judged(False, step=i, asked=asked_of(e), **STEP_NOTE)
            if workload in RANKS:
                # As the exception a user's rank does not catch: the rank ends failed, and
                # torchrun ends the others (which wait on it in a collective). Where its end
                # is studied (WHATIF_DDP_DESTROY_AT_EXIT=1), the OOM itself goes uncaught, as
                # in a user's job, so the hook sees the process die of it.
                if os.environ.get("WHATIF_DDP_DESTROY_AT_EXIT") == "1":
                    raise
                sys.exit(1)
            return
        if stop_at is not None and i == stop_at:
            judged(True, step=i)
            return
        if PROFILE:
            # Sizing a cap: each step's peak, to pick one under which plain PyTorch dies late.
            print(f"profile: step {i} peak_allocated {torch.cuda.max_memory_allocated()} "
                  f"peak_reserved {torch.cuda.max_memory_reserved()} at {time.time():.3f}", flush=True)
            torch.cuda.reset_peak_memory_stats()
        after_step()
    judged(True, step=STEP_LIMIT, note="no OOM in the step limit")


def lightning_steps(workload, cap, stop_at, judged, before_judged, after_step):
    """lightning, lightningaccum: the loop is Lightning's own (Trainer.fit), so the
    harness's step hooks are a Callback: batch `i` is step `i`; at `stop_at` the run is
    judged and stopped."""
    import random

    import torch

    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from transformers import GPT2Config, GPT2LMHeadModel

    random.seed(1234)
    torch.manual_seed(1234)
    cap_from_env(cap, workload)

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=1024, n_head=16, n_positions=2048))

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Shapes(torch.utils.data.IterableDataset):
        """Token batches made on the host, as a tokenizing loader hands them over."""

        def __iter__(self):
            for i in range(STEP_LIMIT):
                batch, length = varying_shape(i)
                yield torch.randint(0, 50257, (batch, length))

    class Judged(Exception):
        pass

    seen = {"step": 0}

    class Judge(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen["step"] = batch_idx
            if stop_at is not None and batch_idx == stop_at:
                before_judged()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if stop_at is not None and batch_idx == stop_at:
                judged(True, step=batch_idx)
                raise Judged()
            if PROFILE:
                print(f"profile: step {batch_idx} peak_allocated {torch.cuda.max_memory_allocated()} "
                      f"peak_reserved {torch.cuda.max_memory_reserved()} at {time.time():.3f}", flush=True)
                torch.cuda.reset_peak_memory_stats()
            if (batch_idx + 1) % accumulate == 0:
                after_step()  # after an optimizer step, not each micro-batch

        def on_exception(self, trainer, module, exception):
            # Before Lightning's teardown (the model to the host, the cache emptied), so
            # the figures judged are the OOM's, as in the other workloads.
            if isinstance(exception, torch.OutOfMemoryError):
                judged(False, step=seen["step"], asked=asked_of(exception))
                seen["judged"] = True

    accumulate = 2 if workload == "lightningaccum" else 1
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=1,
                         max_steps=STEP_LIMIT, gradient_clip_val=1.0, logger=False,
                         accumulate_grad_batches=accumulate,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[Judge()])
    try:
        trainer.fit(LM(), torch.utils.data.DataLoader(Shapes(), batch_size=None))
    except Judged:
        return
    except torch.OutOfMemoryError as e:
        if not seen.get("judged"):
            judged(False, step=seen["step"], asked=asked_of(e))
        return
    judged(True, step=STEP_LIMIT, note="no OOM in the step limit")


def job_main(workload, remedy):
    if workload in RANKS and "LOCAL_RANK" not in os.environ:
        # A torchrun job, as its user starts one: the launcher runs this job in each rank
        # (they print their own judged lines; judged_line reads the failing one's).
        launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={RANKS[workload]}", __file__, "job", workload, remedy])
        sys.exit(launched.returncode)
    stop_at = os.environ.get("WHATIF_STOP_AT")
    holder = None
    if workload == "otherproc":
        # The other process: 60 GiB allocated and freed, cached; it waits for us to end,
        # and calls empty_cache() when told to (the remedy `other_empty_cache`).
        holder = subprocess.Popen([sys.executable, "-c", (
            "import torch,sys,time\n"
            "t=torch.empty(60*2**30,dtype=torch.uint8,device='cuda'); del t\n"
            "print('held', torch.cuda.memory_reserved(), flush=True)\n"
            "for line in sys.stdin:\n"
            "    torch.cuda.empty_cache(); print('emptied', torch.cuda.memory_reserved(), flush=True)\n")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"})
        holder.stdout.readline()
        time.sleep(2.0)  # a viewer at 0.5 s sees the holder's cache before the OOM
        if remedy == "other_empty_cache":
            holder.stdin.write("empty\n")
            holder.stdin.flush()
            holder.stdout.readline()
    try:
        run_job(workload, remedy, int(stop_at) if stop_at else None)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait()


# ---------------------------------------------------------------- the A/B driver


def judged_line(text):
    """The run's outcome: its judged line. In a job of ranks, the first failing rank's
    (another rank may judge its own step done before the collective that waits on the
    failed one hangs), else the first line once every rank has judged; None otherwise."""
    lines = [json.loads(line[len("judged: "):]) for line in text.splitlines() if line.startswith("judged: ")]
    failed = next((j for j in lines if not j["ok"]), None)
    if failed is not None or not lines:
        return failed
    # A job of ranks got through only where every rank says so (a rank that crashed
    # otherwise, an NCCL error say, judges nothing: no outcome then).
    ranks = RANKS.get(lines[0].get("workload"))
    if ranks and len({j.get("rank") for j in lines}) < ranks:
        return None
    return lines[0]


def fresh(workload, remedy, stop_at, log, extra_env=None):
    env = dict(os.environ, **(extra_env or {}))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    conf = conf_for(remedy)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if stop_at is not None:
        env["WHATIF_STOP_AT"] = str(stop_at)
    out, err, timed_out = run_group([sys.executable, __file__, "job", workload, remedy], env, 400)
    with open(log, "w") as f:
        f.write(("timed out after 400 s\n" if timed_out else "") + out + err)
    return None if timed_out else judged_line(out)


def run_group(argv, env, timeout):
    """argv run in a session of its own, its output kept: (stdout, stderr, timed out).
    Past `timeout` seconds its group is sent SIGTERM (torchrun's agent then ends its ranks,
    which it starts in sessions of their own) and given 20 s to end; then every process
    that was below it is killed, and the group (a rank left running would hold its GPU)."""
    import signal

    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        pass
    below = descendants(p.pid)
    try:
        listing = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "-p",
                                  ",".join(str(pid) for pid in [p.pid, *below])],
                                 capture_output=True, text=True).stdout
    except OSError as err:
        listing = "(no ps: %s)\n" % err
    out, err = "", ""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if p.poll() is None or not (out or err):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    return out, err + "\nwhat ran at the timeout:\n" + listing, True


def descendants(pid):
    """Every process below `pid` (from /proc), whatever their session."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def fresh_all(workload, remedies, stop_at, out):
    """`fresh` for each remedy, WHATIF_JOBS at a time (default 1): each is its own process
    under its own memory cap, so runs side by side on one GPU decide the same (the device
    must hold every cap at once: the caller picks WHATIF_JOBS for that). {remedy: judged}"""
    from concurrent.futures import ThreadPoolExecutor

    jobs = max(1, int(os.environ.get("WHATIF_JOBS", "1")))
    if workload == "otherproc":
        jobs = 1  # each run starts its own 60 GiB holder: one at a time fits the card
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {r: pool.submit(fresh, workload, r, stop_at,
                                  os.path.join(out, f"{workload}-{r.replace(':', '_')}.log"))
                   for r in remedies}
        return {r: f.result() for r, f in futures.items()}


def under_vramtop(binary, workload, work):
    """The plain run under `vramtop run --history`, watched by `vramtop attach --json`."""
    env = dict(os.environ, VRAMTOP_SOCKET_DIR=os.path.join(work, "sock"), VRAMTOP_OOM_DIR=work)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if BASE_CONF:
        env["PYTORCH_CUDA_ALLOC_CONF"] = BASE_CONF
    attach = subprocess.Popen([binary, "attach", "--json", "--interval", "0.5", "--seconds",
                               "400", "--until-ended"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.5)
    flags = os.environ.get("WHATIF_RUN_FLAGS", "").split()
    job_out, job_err, timed_out = run_group([binary, "run", *flags, "--", sys.executable, __file__, "job",
                                             workload, "none"], env, int(os.environ.get("WHATIF_RUN_TIMEOUT", "500")))
    if timed_out:
        job_err = "timed out\n" + job_err
    try:
        out, _ = attach.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # A job that ended before the viewer's first look leaves it waiting for a job to
        # end: no live verdicts then (the kept file's still count).
        attach.kill()
        out, _ = attach.communicate()
    with open(os.path.join(work, "attach.jsonl"), "w") as f:
        f.write(out)
    live = None
    for line in out.splitlines():
        try:
            for job in json.loads(line).get("attached", []):
                if job.get("last_oom"):
                    live = job["last_oom"]
        except ValueError:
            pass
    kept = sorted(glob.glob(os.path.join(work, "vramtop-oom-*.pickle")), key=os.path.getmtime)
    history = None
    if kept:
        # Kept beside the table: the GPU-made fixtures of tests/remedies.rs come from here.
        import gzip
        import shutil

        with open(kept[-1], "rb") as src, gzip.open(os.path.join(work, "kept.pickle.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        r = subprocess.run([binary, "replay", "--report", "--json", kept[-1]],
                           capture_output=True, text=True, timeout=300)
        try:
            report = json.loads(r.stdout)
            history = report["trace_ooms"][-1]
            # The replay of the job's own settings over PyTorch's reserved peak (a ratio):
            # where it strays from 1, the replay is not following the job (a torch.compile
            # history's stitch once put it 4 to 6 % off), and its verdicts say little.
            history["replay_vs_trace"] = report["policies"][0].get("reserved_vs_trace")
        except (ValueError, IndexError, KeyError, TypeError):
            history = {"error": r.stderr.strip()[-300:]}
    return judged_line(job_out), live, history, job_out + job_err


STEPPED = ("gpt2var", "kvcache", "kvcache_steps", "gpt2mixed", "llamamix", "resnetvar", "bertaccum", "t5var",
           "gpt2ckpt", "evalmix", "gpt2keep", "gan", "vitvar", "moemix", "gpt2scaler",
           "loramix", "gpt2compile", "llamagen", "gpt2stream", "t5beam", "t5beam_steps", "wav2vec", "mambaslow", "hftrainer", "gpt2sgd", "resnetinfer", "gpt2fixed", "clipvar", "lightning", "lightningaccum", "gpt2tutorial", "gpt2fused", "accelaccum",
           "llamabf16", "unetvar", "graphsteps", "graphsonce", "gpt2graphs", "llamagraphs", "gpt2empties", "gpt2ddp", "gpt2ddp2", "gpt2fsdp2", "gpt2fsdp1", "gpt2loader", "llamafixed", "vitfixed", "resnetfixed", "bertfixed", "llamatune", "gpt2compilefixed", "gpt2scalerfixed", "gpt2scalerskip", "gpt2scalermid", "segformervar", "gpt2offload", "dlrmsparse", "distill", "convnextema", "whispervar", "hftrainerskip", "gpt2accumfirst", "gpt2accumskip", "gpt2ddpaccumskip", "gnnvar", "detrvar", "maskrcnnvar", "timmprog", "gpt2finder")


MAX_SPLIT_TRIED = ["20", "64", "128", "256", "512", "1024", "2048", "4096"]  # MAX_SPLIT_TRIED_MB
ROUNDUP_TRIED = ["2", "4", "8", "16"]  # ROUNDUP_TRIED in crates/vramtop-trace/src/replay/remedies/runs.rs
# WHATIF_REMEDIES=roundup,expandable: only the remedies whose names begin so are run (and
# the control); the others' verdicts are not judged in that call.
ONLY = [p.strip() for p in os.environ.get("WHATIF_REMEDIES", "").split(",") if p.strip()]


def remedy_runs(verdicts, workload="", reasons=None):
    """The remedies to run and, for each, vramtop's verdict ('fits', 'fails', 'cannot_tell').
    In the stepped workloads empty_cache() runs before the judged step, not right before the
    failing request, which no verdict judges; `empty_cache() between steps` is judged by
    empty_cache_steps (after every step).

    With WHATIF_EVERY_SPLIT=1 a `max_split_size_mb` that fits is run at every N the replay
    tried (MAX_SPLIT_TRIED_MB in crates/vramtop-trace/src/replay/remedies.rs): those its
    reason lists ("fits with N = 20, 64") as fitting, the others as `not_listed` (the
    replay found them failing or could not tell; the table counts one PyTorch fits as
    `?`, one it fails as agreeing)."""
    runs = {
        "expandable": verdicts.get("expandable_segments:True"),
        "gc_threshold:0.6": verdicts.get("garbage_collection_threshold:0.6"),
        "expandable_gc": verdicts.get("expandable_segments:True,garbage_collection_threshold:0.6"),
    }
    if workload in STEPPED:
        runs["empty_cache_steps"] = verdicts.get("empty_cache() between steps")
    else:
        # gc.collect() is a control: no verdict claims it.
        runs.update({"empty_cache": verdicts.get("empty_cache()"), "gc_collect": None})
    if workload == "otherproc":
        runs["other_empty_cache"] = next(
            (v for k, v in verdicts.items() if k.startswith("empty_cache() in pid")), None)
    # roundup_power2_divisions: every N tried is run; a "fits" lists those it trusts
    # ("fits with N = 4, 8"), the others are `not_listed`; any other verdict holds for all.
    for name, verdict in verdicts.items():
        if not name.startswith("roundup_power2_divisions:"):
            continue
        listed = re.search(r"fits with N = ([0-9, ]+)", (reasons or {}).get(name, ""))
        fitting = {v.strip() for v in listed.group(1).split(",")} if listed else set()
        if verdict == "fits" and not listed:
            fitting = {name.split(":")[1]}  # the N the verdict names, alone
        for tried in ROUNDUP_TRIED:
            if verdict == "fits":
                runs["roundup:" + tried] = "fits" if tried in fitting else "not_listed"
            else:
                runs["roundup:" + tried] = verdict
    split = [(k, v) for k, v in verdicts.items() if k.startswith("max_split_size_mb:")]
    every = os.environ.get("WHATIF_EVERY_SPLIT") == "1"
    for name, verdict in split:
        n = name.split(":")[1]
        listed = re.search(r"fits with N = ([0-9, ]+)", (reasons or {}).get(name, ""))
        if every and verdict == "fits" and listed:
            fitting = {v.strip() for v in listed.group(1).split(",")}
            for tried in MAX_SPLIT_TRIED:
                runs["max_split:" + tried] = "fits" if tried in fitting else "not_listed"
        elif n == "N":
            for tried in ("20", "200", "1000"):
                runs["max_split:" + tried] = verdict
        else:
            runs["max_split:" + n] = verdict
    return runs


def ab_main(binary, out):
    os.makedirs(out, exist_ok=True)
    rows = []
    with open(os.path.join(out, "ab.jsonl"), "w") as jl:
        for workload in sys.argv[4:] or WORKLOADS:
            work = tempfile.mkdtemp(prefix="whatif-" + workload + "-")
            plain, live, history, log = under_vramtop(binary, workload, work)
            with open(os.path.join(out, workload + "-vramtop.log"), "w") as f:
                f.write(log)
            if os.path.exists(os.path.join(work, "attach.jsonl")):
                os.replace(os.path.join(work, "attach.jsonl"),
                           os.path.join(out, workload + "-attach.jsonl"))
            if os.path.exists(os.path.join(work, "kept.pickle.gz")):
                os.replace(os.path.join(work, "kept.pickle.gz"),
                           os.path.join(out, workload + "-kept.pickle.gz"))
            stop_at = plain.get("step") if plain else None
            live_v = {r["remedy"]: r["verdict"] for r in (live or {}).get("remedies", [])}
            hist_v = {r["remedy"]: r["verdict"] for r in (history or {}).get("remedies", [])}
            live_r = {r["remedy"]: r.get("reason", "") for r in (live or {}).get("remedies", [])}
            hist_r = {r["remedy"]: r.get("reason", "") for r in (history or {}).get("remedies", [])}
            print(workload, "plain:", plain, flush=True)
            # The control: plain PyTorch, no vramtop, no remedy, judged at the same step.
            # The stepped jobs' OOM step is not fixed (seen: gpt2var at step 20 in one call,
            # 23 in others), so a remedy's outcome is only evidence where this reproduces it.
            judged_runs = {"none": None}
            for source, reasons in ((live_v, live_r), (hist_v, hist_r)):
                for remedy, _ in remedy_runs(source, workload, reasons).items():
                    if not ONLY or any(remedy.startswith(p) for p in ONLY):
                        judged_runs.setdefault(remedy, None)
            judged_runs = fresh_all(workload, judged_runs, stop_at, out)
            control = judged_runs.pop("none")
            reproduced = (plain is not None and control is not None and plain["ok"] is False
                          and control["ok"] is False and control.get("step") == plain.get("step")
                          and control.get("asked") == plain.get("asked"))
            print(workload, "control:", control, "reproduced:", reproduced,
                  "replay vs PyTorch's reserved peak:", (history or {}).get("replay_vs_trace"), flush=True)
            for remedy, outcome in judged_runs.items():
                row = dict(workload=workload, remedy=remedy,
                           live=remedy_runs(live_v, workload, live_r).get(remedy),
                           history=remedy_runs(hist_v, workload, hist_r).get(remedy),
                           pytorch=None if outcome is None else
                           ("fits" if outcome["ok"] else "fails"),
                           plain_ok=None if plain is None else plain["ok"],
                           reproduced=reproduced,
                           oom_line=(live or {}).get("line"))
                if BASE_CONF:
                    row["base_conf"] = BASE_CONF
                rows.append(row)
                jl.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
            jl.write(json.dumps(dict(workload=workload, control=control, reproduced=reproduced,
                                     live_oom=live, history_oom=history)) + "\n")
            jl.flush()
            # After each workload: a call cut short still leaves a table.
            table(rows, os.path.join(out, "table.md"), quiet=True)
    table(rows, os.path.join(out, "table.md"))


def scan_main(workload, caps):
    """Where a stepped workload dies under each cap, plainly and with expandable segments
    (the cap at which fragmentation, not the batch, ends the job)."""
    if workload not in CAP_ENV:
        sys.exit(f"scan: no cap to vary for {workload}")
    env_name = CAP_ENV[workload][0]
    for cap_gib in caps:
        os.environ[env_name] = str(cap_gib)
        with tempfile.NamedTemporaryFile(suffix=".log") as log:
            plain = fresh(workload, "none", None, log.name)
            stop_at = plain.get("step") if plain and not plain["ok"] else None
            # Expandable segments judged at the plain run's last step: does it get past it?
            expandable = fresh(workload, "expandable", stop_at, log.name) if stop_at else None
        print(json.dumps(dict(cap_gib=cap_gib, plain=plain, expandable=expandable)), flush=True)


def nudge_main(workload, remedy, stop_at, nudges):
    """One remedy of a stepped workload judged at `stop_at` (the plain run's OOM step),
    once per nudge of CUDA's address space (`nudge_address_space`; 0: none), WHATIF_JOBS at
    a time: does PyTorch's outcome turn on where CUDA places its segments?"""
    from concurrent.futures import ThreadPoolExecutor

    def one(megabytes):
        with tempfile.NamedTemporaryFile(suffix=".log") as log:
            return fresh(workload, remedy, stop_at, log.name, extra_env={"WHATIF_VA_NUDGE_MB": str(megabytes)})

    with ThreadPoolExecutor(max_workers=max(1, int(os.environ.get("WHATIF_JOBS", "1")))) as pool:
        for megabytes, judged in zip(nudges, pool.map(one, nudges)):
            print(json.dumps(dict(workload=workload, remedy=remedy, stop_at=stop_at, nudge_mb=megabytes,
                                  judged=judged)), flush=True)


def table(rows, path, quiet=False):
    def agree(v, p, reproduced):
        if v is None or p is None:
            return "-"
        if v == "cannot_tell" or (v == "not_listed" and p == "fits"):
            return "?"
        if v == "not_listed":
            v = "fails"  # not among those the replay says fit, and PyTorch failed too
        if not reproduced:
            # Plain PyTorch did not die where the run under vramtop did: no evidence.
            return "n/r"
        return "ok" if v == p else "WRONG"

    lines = ["| workload | remedy | live verdict | history verdict | PyTorch | |",
             "|---|---|---|---|---|---|"]
    count = {"ok": 0, "WRONG": 0, "?": 0, "n/r": 0}
    # A remedy's run that ended with no outcome (it hung, or crashed) is no evidence.
    no_outcome = sum(1 for r in rows if r["pytorch"] is None)
    for r in rows:
        reproduced = r.get("reproduced", True)
        marks = [agree(r["live"], r["pytorch"], reproduced),
                 agree(r["history"], r["pytorch"], reproduced)]
        for m in marks:
            if m in count:
                count[m] += 1
        lines.append(f"| {r['workload']} | {r['remedy']} | {r['live'] or '-'} | "
                     f"{r['history'] or '-'} | {r['pytorch'] or '-'} | {' / '.join(marks)} |")
    lines.append("")
    lines.append(f"verdicts equal to PyTorch's outcome: {count['ok']}; wrong: {count['WRONG']}; "
                 f"cannot tell: {count['?']}; not reproduced without vramtop (n/r): "
                 f"{count['n/r']}; remedy runs with no PyTorch outcome: {no_outcome}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "job":
        job_main(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "none")
    elif len(sys.argv) >= 6 and sys.argv[1] == "nudge":
        nudge_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), [int(n) for n in sys.argv[5:]])
    elif len(sys.argv) >= 4 and sys.argv[1] == "scan":
        scan_main(sys.argv[2], [float(c) for c in sys.argv[3:]])
    elif len(sys.argv) >= 4 and sys.argv[1] == "ab":
        ab_main(os.path.abspath(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(__doc__)

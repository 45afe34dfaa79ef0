"""Parameter shapes of ResNet-50 and BERT-base, written from the architectures' definitions.

``bench/strategy.py`` all-reduces gradients of exactly these shapes (one float32 tensor per
trainable parameter, in the models' own order), so per-tensor and bucketing costs count as they
would in training; no model code is needed.

- ResNet-50 (He et al. 2015; torchvision's ``resnet50``): a 7x7 stem conv and its batch norm,
  four stages of bottlenecks ([3, 4, 6, 3] blocks of widths 64, 128, 256, 512, expansion 4;
  the first block of each stage has a 1x1 downsample conv and batch norm), then ``fc`` 2048 ->
  1000. Convolutions have no bias; each batch norm has gamma and beta. 161 tensors,
  25,557,032 parameters. Conv weights are (out, in, kh, kw), as torch stores them.
- BERT-base (Devlin et al. 2018; Hugging Face's ``BertModel``): word (30522), position (512)
  and token-type (2) embeddings of width 768 and their layer norm; 12 layers of self-attention
  (query, key, value, output 768x768 with biases, layer norm) and feed-forward (768 -> 3072 ->
  768 with biases, layer norm); the pooler 768x768. 199 tensors, 109,482,240 parameters.
  Dense weights are (out, in), as ``nn.Linear`` stores them.
"""

from __future__ import annotations

import math

__all__ = ["MODELS", "bert_base", "parameter_count", "resnet50"]

Shape = tuple[int, ...]


def _batch_norm(name: str, width: int) -> list[tuple[str, Shape]]:
    return [(f"{name}.gamma", (width,)), (f"{name}.beta", (width,))]


def resnet50() -> list[tuple[str, Shape]]:
    """``[(name, shape), ...]`` of ResNet-50's 161 trainable parameters."""
    params: list[tuple[str, Shape]] = [("conv1.weight", (64, 3, 7, 7)), *_batch_norm("bn1", 64)]
    inplanes = 64
    for stage, (blocks, planes) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512),
                                                 strict=True), start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            params += [(f"{prefix}.conv1.weight", (planes, inplanes, 1, 1)),
                       *_batch_norm(f"{prefix}.bn1", planes),
                       (f"{prefix}.conv2.weight", (planes, planes, 3, 3)),
                       *_batch_norm(f"{prefix}.bn2", planes),
                       (f"{prefix}.conv3.weight", (planes * 4, planes, 1, 1)),
                       *_batch_norm(f"{prefix}.bn3", planes * 4)]
            if block == 0:  # the stage changes width (and stride): a projection shortcut
                params += [(f"{prefix}.downsample.0.weight", (planes * 4, inplanes, 1, 1)),
                           *_batch_norm(f"{prefix}.downsample.1", planes * 4)]
            inplanes = planes * 4
    params += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return params


def _dense(name: str, out: int, inp: int) -> list[tuple[str, Shape]]:
    return [(f"{name}.weight", (out, inp)), (f"{name}.bias", (out,))]


def _layer_norm(name: str, width: int) -> list[tuple[str, Shape]]:
    return [(f"{name}.weight", (width,)), (f"{name}.bias", (width,))]


def bert_base(vocab: int = 30522, hidden: int = 768, layers: int = 12, intermediate: int = 3072,
              positions: int = 512, token_types: int = 2) -> list[tuple[str, Shape]]:
    """``[(name, shape), ...]`` of BERT-base's 199 trainable parameters (with the pooler)."""
    params: list[tuple[str, Shape]] = [
        ("embeddings.word_embeddings.weight", (vocab, hidden)),
        ("embeddings.position_embeddings.weight", (positions, hidden)),
        ("embeddings.token_type_embeddings.weight", (token_types, hidden)),
        *_layer_norm("embeddings.LayerNorm", hidden),
    ]
    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            params += _dense(f"{prefix}.attention.self.{part}", hidden, hidden)
        params += [*_dense(f"{prefix}.attention.output.dense", hidden, hidden),
                   *_layer_norm(f"{prefix}.attention.output.LayerNorm", hidden),
                   *_dense(f"{prefix}.intermediate.dense", intermediate, hidden),
                   *_dense(f"{prefix}.output.dense", hidden, intermediate),
                   *_layer_norm(f"{prefix}.output.LayerNorm", hidden)]
    params += _dense("pooler.dense", hidden, hidden)
    return params


def parameter_count(shapes: list[tuple[str, Shape]]) -> int:
    """The number of scalars in ``shapes``."""
    return sum(math.prod(shape) for _, shape in shapes)


MODELS = {"resnet50": resnet50, "bert-base": bert_base}

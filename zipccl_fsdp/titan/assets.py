"""Build the tokenizer and text corpus that CPU runs of torchtitan train on.

The torchtitan wheel ships neither a tokenizer nor a dataset (its configs point
at ``./tests/assets/...`` of a source checkout), and CI machines may have no
network. So we generate both here, deterministically, into a cache directory:

``<cache>/titan-assets-v1/``
    ``tokenizer/tokenizer.json``, ``tokenizer/tokenizer_config.json``
        a byte-level BPE (at most 2048 tokens; about 850 on this corpus;
        ``<|begin_of_text|>`` = 0,
        ``<|end_of_text|>`` = 1) trained with ``tokenizers`` on the corpus;
        torchtitan's ``HuggingFaceTokenizer`` reads this folder
        (``Trainer.Config.hf_assets_path``).
    ``data/train.jsonl``
        about 2,000 short documents ``{"text": ...}`` drawn from a small
        grammar (people, places, objects, arithmetic facts) with a fixed seed;
        torchtitan's ``c4_test`` loader reads it through
        ``dataloader.dataset_path`` (``datasets.load_dataset(<dir>)``).

The text has learnable structure (agreement, arithmetic that is right), so a
tiny model's loss falls visibly within a few dozen steps.

The cache root is ``$ZIPCCL_FSDP_CACHE_DIR``, else
``$XDG_CACHE_HOME/zipccl_fsdp``, else ``~/.cache/zipccl_fsdp``. Every rank of
a job calls :func:`ensure_titan_assets` at the same time; a file lock and an
atomic rename make exactly one of them build and the others wait for it.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Bump when the corpus grammar or tokenizer settings change: a new folder name
# makes old caches irrelevant instead of silently reused.
ASSETS_VERSION = 1
VOCAB_SIZE = 2048
"""Upper bound of the tokenizer vocabulary: the llama3 debugmodel's ``vocab_size``."""
NUM_DOCUMENTS = 2000
CORPUS_SEED = 20240611
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"


@dataclass(frozen=True)
class TitanAssets:
    """Paths of one built asset folder."""

    root: Path

    @property
    def tokenizer_dir(self) -> Path:
        """Folder for ``Trainer.Config.hf_assets_path``."""
        return self.root / "tokenizer"

    @property
    def dataset_dir(self) -> Path:
        """Folder for ``HuggingFaceTextDataLoader.Config.dataset_path``."""
        return self.root / "data"


def default_cache_dir() -> Path:
    """Return the cache root used when none is given."""
    explicit = os.environ.get("ZIPCCL_FSDP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "zipccl_fsdp"


def ensure_titan_assets(cache_dir: str | os.PathLike | None = None) -> TitanAssets:
    """Return the tokenizer and corpus folders, building them on first use.

    Safe to call from every rank at once: one process builds into a temporary
    folder under a file lock and renames it into place; the others find it.

    Example::

        assets = ensure_titan_assets()
        config.hf_assets_path = str(assets.tokenizer_dir)
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"titan-assets-v{ASSETS_VERSION}"
    assets = TitanAssets(final)
    if _complete(assets):
        return assets
    with open(cache / f".titan-assets-v{ASSETS_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(assets):
            return assets
        if final.exists():  # a build that died half-way, before the rename
            shutil.rmtree(final)
        staging = Path(tempfile.mkdtemp(prefix=".titan-assets-", dir=cache))
        try:
            _build(TitanAssets(staging))
            os.rename(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return assets


def _complete(assets: TitanAssets) -> bool:
    return all(
        p.is_file()
        for p in (
            assets.tokenizer_dir / "tokenizer.json",
            assets.tokenizer_dir / "tokenizer_config.json",
            assets.dataset_dir / "train.jsonl",
        )
    )


def _build(assets: TitanAssets) -> None:
    docs = generate_corpus()
    assets.dataset_dir.mkdir(parents=True)
    with open(assets.dataset_dir / "train.jsonl", "w") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")
    assets.tokenizer_dir.mkdir(parents=True)
    _train_tokenizer(docs, assets.tokenizer_dir)


def _train_tokenizer(docs: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        # every byte stays encodable, whatever text is fed later
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs, trainer=trainer)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    # torchtitan's HuggingFaceTokenizer reads BOS/EOS from here; the dataset
    # asks for them explicitly (encode(add_bos=True, add_eos=True)).
    config = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# ---------------------------------------------------------------------------
# The corpus grammar. Word lists are small on purpose: a 2048-token BPE covers
# most words whole, and a model of 64 dimensions can learn the patterns.

_NAMES = (
    "Ada", "Boris", "Chen", "Dara", "Elif", "Farid", "Greta", "Hiro", "Ines",
    "Jonas", "Kemal", "Lena", "Mateo", "Nadia", "Olaf", "Priya", "Quinn",
    "Rosa", "Sami", "Tomas", "Uma", "Viktor", "Wen", "Yara", "Zoran",
)
_PLACES = (
    "the harbor", "the old mill", "the market", "the library", "the station",
    "the orchard", "the bridge", "the north tower", "the bakery", "the garden",
    "the school", "the river bank", "the workshop", "the museum", "the farm",
)
_ADJECTIVES = (
    "red", "small", "heavy", "quiet", "bright", "old", "new", "wooden",
    "broken", "green", "tall", "round", "cold", "warm", "empty", "golden",
)
_NOUNS = (
    "box", "lamp", "boat", "map", "clock", "basket", "letter", "key", "coat",
    "kettle", "ladder", "book", "bottle", "drum", "rope", "wheel", "chair",
)
_VERBS = (
    ("carries", "carried"), ("paints", "painted"), ("repairs", "repaired"),
    ("finds", "found"), ("sells", "sold"), ("opens", "opened"),
    ("moves", "moved"), ("cleans", "cleaned"), ("builds", "built"),
    ("hides", "hid"), ("weighs", "weighed"), ("counts", "counted"),
)
_TIMES = (
    "In the morning", "At noon", "In the evening", "On Monday", "On Friday",
    "After the rain", "Before sunrise", "Every winter", "Last summer",
)
_NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
    "nine", "ten", "eleven", "twelve",
)


def _thing(rng: random.Random) -> str:
    return f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"


def _sentence(rng: random.Random, person: str, place: str) -> str:
    kind = rng.randrange(7)
    present, past = rng.choice(_VERBS)
    if kind == 0:
        return f"{person} {present} {_thing(rng)} at {place}."
    if kind == 1:
        return f"{rng.choice(_TIMES)}, {person} {past} {_thing(rng)} near {place}."
    if kind == 2:
        a, b = rng.randrange(7), rng.randrange(7)
        return (
            f"{person} counts {_NUMBER_WORDS[a]} and {_NUMBER_WORDS[b]} "
            f"{rng.choice(_NOUNS)}s, so there are {_NUMBER_WORDS[a + b]}."
        )
    if kind == 3:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"{a} plus {b} is {a + b}."
    if kind == 4:
        other = rng.choice(_NAMES)
        return f"{person} gives {_thing(rng)} to {other}, and {other} {present} it."
    if kind == 5:
        return f"The {rng.choice(_NOUNS)} at {place} is {rng.choice(_ADJECTIVES)}."
    a = rng.randrange(2, 10)
    return f"{person} walks {a} miles from {place} to {rng.choice(_PLACES)}."


def generate_corpus(
    num_documents: int = NUM_DOCUMENTS, seed: int = CORPUS_SEED
) -> list[str]:
    """Return ``num_documents`` short texts; the same list for the same seed.

    ``random.Random`` with an integer seed gives the same stream on every
    CPython 3 release, so the corpus (and the tokenizer trained on it) is the
    same on every machine.
    """
    rng = random.Random(seed)
    docs = []
    for _ in range(num_documents):
        person, place = rng.choice(_NAMES), rng.choice(_PLACES)
        title = f"{person} and {place}"
        body = " ".join(
            _sentence(rng, person, place) for _ in range(rng.randrange(3, 12))
        )
        docs.append(f"{title}\n{body}")
    return docs

"""Typed configs shared by every experiment: one dataclass field per option, each with its help.

A milestone's ``Config`` subclasses :class:`CommonConfig`; the CLI turns fields into flags
(``global_batch`` → ``--global-batch``). Named presets (``PRESETS``): ``Config.laptop()`` for the
chapters' figures, ``Config.tiny()`` for tests, ``Config.from_preset(name, **changes)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from .runtime import validate_backend, validate_world_size


def opt(default, help: str, **kw):
    """A config field with its help text (shown by ``python -m lesson_lib run X --help``).

    ``cli=False`` keeps an inherited option that an experiment does not use off its command line.
    """
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class CommonConfig:
    world_size: int = opt(2, "number of ranks (processes)")
    backend: str = opt("auto", "auto | gloo | nccl (auto: NCCL with a GPU per rank, else Gloo on CPU)")
    steps: int = opt(20, "training steps")
    global_batch: int = opt(64, "samples per step summed over all ranks")
    seed: int = opt(0, "seed for model initialisation and data order")
    lr: float = opt(0.01, "learning rate")
    timeout_s: float = opt(30.0, "collective timeout in seconds (a silent rank fails after this)")

    PRESETS: ClassVar[dict[str, dict]] = {}
    """Named sizes: option → value, over the field defaults (a milestone sets its own)."""

    @classmethod
    def from_preset(cls, name: str, **changes) -> "CommonConfig":
        """The preset ``name`` with ``changes`` on top, validated (a bad option raises, naming it)."""
        if name not in cls.PRESETS:
            raise ValueError(f"preset must be one of {', '.join(cls.PRESETS) or '(none defined)'} "
                             f"for {cls.__module__}.{cls.__name__}, got {name!r}")
        unknown = set(changes) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown option(s) for {cls.__name__}: {', '.join(sorted(unknown))}")
        return cls(**{**cls.PRESETS[name], **changes}).validate()

    @classmethod
    def laptop(cls, **changes) -> "CommonConfig":
        """The size the chapter's figures run on a laptop (2 cores)."""
        return cls.from_preset("laptop", **changes)

    @classmethod
    def tiny(cls, **changes) -> "CommonConfig":
        """The smallest size that still shows the result: tests and quick checks."""
        return cls.from_preset("tiny", **changes)

    def validate(self) -> "CommonConfig":
        validate_world_size(self.world_size)
        validate_backend(self.backend)
        positive_int(self, "steps")
        positive_int(self, "global_batch")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if not 0 < self.timeout_s <= 3600:
            raise ValueError(f"timeout_s must be in (0, 3600], got {self.timeout_s!r}")
        return self

    def as_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "CommonConfig":
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown option(s) for {type(self).__name__}: {', '.join(sorted(unknown))}")
        return type(self)(**{**asdict(self), **changes}).validate()


def positive_int(cfg, name: str) -> None:
    """Raise a ValueError naming ``name`` unless ``cfg.name`` is an int ≥ 1."""
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")


def parse_stragglers(spec: str, world_size: int, name: str = "straggler") -> dict[int, float]:
    """``"1:3"`` or ``"1:3,2:1.5"`` → {rank: slowdown factor}; factor ≥ 1, rank < world_size."""
    out: dict[int, float] = {}
    if not spec:
        return out
    for part in str(spec).split(","):
        try:
            r, f = part.split(":")
            rank, factor = int(r), float(f)
        except ValueError:
            raise ValueError(f"{name} must look like RANK:FACTOR (e.g. 1:3), got {part!r}") from None
        if not 0 <= rank < world_size:
            raise ValueError(f"{name}: rank {rank} is outside 0..{world_size - 1}")
        if not factor >= 1:
            raise ValueError(f"{name}: slowdown factor must be at least 1, got {factor}")
        out[rank] = factor
    return out


@dataclass
class TrainConfig(CommonConfig):
    """Options of the small training task shared by the training milestones."""

    hidden: int = opt(128, "width of the hidden layers")
    depth: int = opt(3, "number of hidden layers")
    d_in: int = opt(32, "input features")
    classes: int = opt(10, "output classes")
    samples: int = opt(4096, "size of the generated data set")

    def task(self) -> dict:
        """The options that define the training problem (model, data, batch, steps, seed, lr)."""
        names = ("steps", "global_batch", "seed", "lr", "hidden", "depth", "d_in", "classes", "samples")
        return {n: getattr(self, n) for n in names}

    def validate(self) -> "TrainConfig":
        super().validate()
        for name in ("hidden", "depth", "d_in", "classes", "samples"):
            positive_int(self, name)
        if self.global_batch > self.samples:
            raise ValueError(f"global_batch={self.global_batch} exceeds samples={self.samples}")
        return self

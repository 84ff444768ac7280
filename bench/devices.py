"""The device table: theoretical memory bandwidth and matrix peaks, with their sources.

Peaks are per second, dense (no sparsity): "fp16" (GPUs: tensor units), "fp32" (FMA units),
"int8" (integer dot products, 2 operations per multiply-add); which one a format's products
run at is Device.matrix_peak's rule.

The table ships as `devices.json` in this package; users add devices with files of the
same form (`--devices FILE`), or give `--peak-gbs` / `--peak-gflops` directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


class DeviceError(ValueError):
    """An unknown device or an unreadable device file."""


@dataclass(frozen=True)
class Device:
    name: str
    title: str
    bandwidth: float  # bytes per second
    flops: dict[str, float] = field(default_factory=dict)  # matrix peaks per second (PEAKS)
    kind: str = "custom"
    source: str = ""
    hw_class: str = ""  # the class of the published measurements like it (bench/published)

    def peak_flops(self, weights: str) -> float | None:
        """The matrix peak products of `weights` run at (matrix_peak)."""
        return self.matrix_peak(weights)[1]

    def matrix_peak(self, weights: str) -> tuple[str, float | None]:
        """(which peak, FLOPS) the products of `weights` can run at: the fastest unit an
        engine may use for the format, so that no measurement beats the bound.
        f32 weights: FP32 everywhere. On a GPU, f16/bf16: FP16 (tensor units; Apple's GPU
        at its FP16 rate) or FP32 where that is faster (Pascal's crippled half rate);
        quantized formats: INT8 or FP16, the faster: llama.cpp's CUDA MMQ multiplies the
        int8 codes on int8 tensor cores (dp4a without them), older builds and other GPUs
        dequantize to half for cuBLAS / simdgroup matrices. On a CPU, f16 and bf16: the
        half-precision rate where the device lists one (ARMv8.2 FP16 FMA), else FP32 FMA
        after widening; quantized formats: the int8 dot-product peak (llama.cpp's and
        llamafile's products of the int8 codes with activations rounded to 8 bits). A peak
        the device does not list falls back to FP32."""
        fmt = weights.lower()
        if fmt in ("f32", "fp32"):
            wants = ("fp32",)
        elif self.kind in GPU_KINDS:
            wants = ("fp16", "fp32") if fmt in FLOAT_FORMATS else ("int8", "fp16")
        elif fmt in FLOAT_FORMATS:
            wants = ("fp16",)
        else:
            wants = ("int8",)
        listed = [(k, self.flops[k]) for k in wants if k in self.flops]
        if listed:
            return max(listed, key=lambda kv: kv[1])
        return "fp32", self.flops.get("fp32")

    def float_peak(self) -> float | None:
        """The half-precision peak where the device lists one, else FP32: the rate of the
        products engines run in floating point (attention's; a GPU's dequantized weights)."""
        return self.flops.get("fp16") or self.flops.get("fp32")

    def engine_peak(self, weights: str) -> float | None:
        """The rate the expected speed puts the products of `weights` at (the bound keeps
        matrix_peak's): on a GPU at most the float peak, since llama.cpp dequantizes
        quantized weights to half precision for the tensor units (Metal's simdgroup
        matrices, Vulkan's shaders) and its int8 kernels spend their time unpacking the
        codes: quantized and float weights reach a like share of the half rate. On a CPU
        matrix_peak's: the int8 dot products do run on the quantized codes."""
        peak = self.matrix_peak(weights)[1]
        if self.kind in GPU_KINDS and peak and self.float_peak():
            return min(peak, self.float_peak())
        return peak


GPU_KINDS = ("gpu", "soc")  # devices whose matrix products run on a GPU
FLOAT_FORMATS = ("f32", "fp32", "f16", "fp16", "bf16")
PEAKS = ("fp16", "fp32", "int8")  # the matrix peaks a device lists (FLOPS; int8: OPS)


# A device entry without a "class": the class its name and title say (first match wins).
CLASS_WORDS = (
    ("apple-cpu", r"apple.*\bcpu\b|\bcpu\b.*apple"),
    ("apple-gpu", r"apple|\bm[1-9]( (pro|max|ultra))?\b"),
    ("intel-gpu", r"intel.*\b(arc|gpu|iris|xe)\b|\barc ?[ab]\d{3}"),
    (
        "nvidia-gpu",
        r"nvidia|geforce|\brtx|\bgtx|tesla|quadro|\b[abhl]\d{2,3}\b|\b[gb]\d{3}\b"
        r"|\bl4\b|\bt4\b|\bv100|\bp40|\bp100|jetson",
    ),
    ("amd-gpu", r"radeon|instinct|\bmi\d{2,3}|\brx ?\d{3,4}|\bw\d{4}\b"),
    (
        "board",
        r"raspberry|\bpi [345]\b|orange pi|rockchip|\brk\d{4}|snapdragon|\bcix\b"
        r"|radxa|board",
    ),
)


def guess_class(entry: dict) -> str:
    """The hardware class of a device entry that names none (bench/published's classes,
    intel-gpu too), from its name and title; "cpu" when a "kind" of cpu says so or no
    word matches a GPU's, so that `sol` finds a fit for it."""
    text = f"{entry.get('name', '')} {entry.get('title', '')}".lower()
    kind = entry.get("kind", "")
    for cls, words in CLASS_WORDS:
        if re.search(words, text) and not (kind == "cpu" and cls.endswith("-gpu")):
            return cls
    return "apple-cpu" if kind == "cpu" and "apple" in text else "cpu"


def kind_of(hw_class: str) -> str:
    """The kind of a class's devices: "soc" (Apple's GPU), "gpu" or "cpu"."""
    return {"apple-gpu": "soc"}.get(hw_class, "gpu" if hw_class.endswith("-gpu") else "cpu")


def _parse(text: str, origin: str) -> dict[str, Device]:
    try:
        entries = json.loads(text)["devices"]
        return {e["name"].lower(): _device(e, origin) for e in entries}
    except (KeyError, TypeError, ValueError) as e:
        raise DeviceError(f"{origin}: not a device table ({e})") from None


def _device(e: dict, origin: str) -> Device:
    """One entry of a device table; its class guessed where it names none (guess_class),
    its kind that class's where it names none."""
    hw_class = e.get("class") or guess_class(e)
    return Device(name=e["name"].lower(), title=e.get("title", e["name"]),
                  bandwidth=float(e["bandwidth"]), flops=_peaks(e.get("flops", {}), e["name"]),
                  kind=e.get("kind") or kind_of(hw_class), source=e.get("source", origin),
                  hw_class=hw_class)  # fmt: skip


def _peaks(flops: dict, name: str) -> dict[str, float]:
    """A device's matrix peaks, per second: {"fp16", "fp32", "int8"}, each optional."""
    out = {k: float(v) for k, v in flops.items()}
    bad = [k for k, v in out.items() if k not in PEAKS or not v > 0]
    if bad:
        raise ValueError(f"{name}: flops {bad[0]!r} (peaks: {', '.join(PEAKS)}, positive)")
    return out


def load_devices(extra: list[str | Path] = ()) -> dict[str, Device]:
    """The built-in table, then each extra file (whose entries override by name)."""
    table = _parse(resources.files("bench").joinpath("devices.json").read_text(), "devices.json")
    for path in extra:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DeviceError(f"cannot read the device file {path}: {e}") from None
        table.update(_parse(text, str(path)))
    return table


def get_device(
    name: str | None = None,
    extra: list[str | Path] = (),
    peak_gbs: float | None = None,
    peak_gflops: float | None = None,
) -> Device | None:
    """A device by name, or one made of --peak-gbs / --peak-gflops; None if neither."""
    if name is not None:
        table = load_devices(extra)
        key = name.lower()
        if key not in table:
            raise DeviceError(f"unknown device {name!r} (known: {', '.join(sorted(table))})")
        d = table[key]
        if peak_gbs is None and peak_gflops is None:
            return d
        flops = {"fp32": peak_gflops * 1e9} if peak_gflops else d.flops
        return Device(d.name, d.title, peak_gbs * 1e9 if peak_gbs else d.bandwidth, flops,
                      d.kind, "user", d.hw_class)  # fmt: skip
    if peak_gbs is None:
        if peak_gflops is not None:
            raise DeviceError("--peak-gflops needs --peak-gbs (or --device)")
        return None
    flops = {"fp32": peak_gflops * 1e9} if peak_gflops else {}
    return Device("custom", f"{peak_gbs:g} GB/s", peak_gbs * 1e9, flops, "custom", "--peak-gbs")

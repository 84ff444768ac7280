"""The device table: theoretical memory bandwidth and peak FLOPS, with their sources.

The table ships as `devices.json` in this package; users add devices with files of the
same form (`--devices FILE`), or give `--peak-gbs` / `--peak-gflops` directly.
"""

from __future__ import annotations

import json
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
    flops: dict[str, float] = field(default_factory=dict)  # peak FLOPS by dtype
    kind: str = "custom"
    source: str = ""
    hw_class: str = ""  # the class of the published measurements like it (bench/published)

    def peak_flops(self, weights: str) -> float | None:
        """FP32 peak for f32 weights; FP16 (tensor) peak for other formats, which a GPU
        engine would compute in half precision; FP32 when FP16 is not listed."""
        if weights != "f32" and "fp16" in self.flops:
            return self.flops["fp16"]
        return self.flops.get("fp32")


def _parse(text: str, origin: str) -> dict[str, Device]:
    try:
        entries = json.loads(text)["devices"]
        return {
            e["name"].lower(): Device(
                name=e["name"].lower(),
                title=e.get("title", e["name"]),
                bandwidth=float(e["bandwidth"]),
                flops={k: float(v) for k, v in e.get("flops", {}).items()},
                kind=e.get("kind", "custom"),
                source=e.get("source", origin),
                hw_class=e.get("class", ""),
            )
            for e in entries
        }
    except (KeyError, TypeError, ValueError) as e:
        raise DeviceError(f"{origin}: not a device table ({e})") from None


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

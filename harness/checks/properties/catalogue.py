"""The whole table of model-level properties, :data:`PROPERTIES`, and its markdown (docs/checks.md, "Every
property")."""
from __future__ import annotations

from .trial_rows import VARIANT_ROWS
from .table import PROBE_ROWS, Property

#: Every model-level property: the ``probe`` rows (:data:`harness.checks.properties.table.PROBE_ROWS`), then the
#: ``variant`` and ``trial`` rows (:data:`harness.checks.properties.trial_rows.VARIANT_ROWS`), each in the order it runs.
PROPERTIES: tuple[Property, ...] = PROBE_ROWS + VARIANT_ROWS


def properties_markdown() -> str:
    """The table of :data:`PROPERTIES` as docs/checks.md holds it between its ``properties`` markers
    (``python -m harness.checks.properties.catalogue`` prints it)."""
    from tabulate import tabulate

    rows = [[f"**{p.name}**", p.kind, ", ".join(p.where), p.inputs, p.applies, p.fault, f"`{p.catches}`"]
            for p in PROPERTIES]
    return tabulate(rows, ["property", "kind", "runs in", "inputs", "applies", "fault it names", "plugin it catches"],
                    tablefmt="github")


if __name__ == "__main__":
    print(properties_markdown())

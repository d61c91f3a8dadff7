"""Shapes the benches generate besides the bundled ones (``topology_devkit.synthetic.SHAPES``).

``z17-382``: a z17-like LPAR of 382 CPUs: 4 drawers of 4 books (DCMs) with 2 sockets (chips) each, sockets
of 4 or 7 cores (21 of 7, 11 of 4: 191 cores), SMT-2, 8 core slots per chip (gaps in the core ids): a z17 LPAR
as one was measured (bench/HISTORY.md, off the happy path).
"""

from __future__ import annotations

from topology_devkit.synthetic import Layout, LparShape

# Per drawer, per book, the core count of each socket: 11 books of (7, 4) and 5 of (7, 7).
Z17_382_LAYOUT: Layout = tuple(
    tuple((7, 7) if 4 * d + b in (0, 3, 6, 9, 12) else (7, 4) for b in range(4))
    for d in range(4)
)

Z17_382 = LparShape(
    name="z17-382",
    machine_type="9175",
    description="z17-like: 4 drawers x 4 books x 2 sockets of 4 or 7 cores, 191 cores, 382 CPUs, SMT-2",
    drawers=Z17_382_LAYOUT,
    cores_per_chip=8,
)

assert Z17_382.cpu_count == 382, Z17_382.cpu_count

"""The reference data spotbag ships (controller/data/reference/, package data of the
wheel): the VM lifetimes the shipped preemption models were fitted to, the 2015 EC2
spot price trace the hopping examples replay, and the Slurm trace the prepaid examples
read. controller/data/reference/README.md says what each file is, where it comes from,
its licence and how it was derived; `spotbag data list` and `spotbag data path NAME`
print where an install keeps them.

Only paths live here: the readers are controller.tools.lifetime_data,
controller.traces.price_trace and controller.tools.prepaid_report (gzip or not, by magic).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Beside this module in a checkout and in an installed wheel alike (package data).
REFERENCE_DIR = Path(__file__).resolve().parent.parent / "data" / "reference"


@dataclass(frozen=True)
class Dataset:
    name: str
    relative_path: str  # under REFERENCE_DIR
    description: str

    @property
    def path(self) -> Path:
        return REFERENCE_DIR / self.relative_path


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            "lifetimes",
            "goog-preemption/lifetimes.csv",
            "1,442 Google preemptible VM lifetimes, Feb-Apr 2019 (spotbag fit)",
        ),
        Dataset(
            "spot-prices",
            "spot-prices/us-east-1_spot_2015-03_to_2015-08.csv.gz",
            "274,099 EC2 spot price changes, us-east-1, Mar-Aug 2015 (spotbag index, "
            "simulate-hopping)",
        ),
        Dataset(
            "swf",
            "hpc-traces/DOST-ASTI_COARE-Saliksik-2020-cln.swf.gz",
            "19,760 Slurm jobs of DOST-ASTI COARE Saliksik, Mar-Sep 2020, SWF (spotbag prepaid)",
        ),
    )
}


LIFETIMES = DATASETS["lifetimes"].path
SPOT_PRICES = DATASETS["spot-prices"].path
SWF = DATASETS["swf"].path

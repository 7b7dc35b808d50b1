"""`trtllm-truss bench`: load generation against the engine model, the ensemble and truss's HTTP
endpoint, with TTFT / inter-token / end-to-end latency percentiles and throughput (docs/performance.md).

Modules: `workload` (requests), `load` (closed/open loop levels, Poisson arrivals), `targets` (the three
endpoints), `runner` (one target at one level), `stats` (records -> metrics), `session` (the whole run),
`report` (typed JSON + table), `plot` (PNG).
"""

from trtllm_truss.bench.load import ClosedLoop, OpenLoop, poisson_arrival_offsets
from trtllm_truss.bench.report import BenchReport
from trtllm_truss.bench.session import BenchPlan, run_bench
from trtllm_truss.bench.stats import percentile, summarize
from trtllm_truss.bench.workload import BenchRequest, LengthDistribution, WorkloadSpec, generate_workload

__all__ = [
    "BenchPlan", "BenchReport", "BenchRequest", "ClosedLoop", "LengthDistribution", "OpenLoop",
    "WorkloadSpec", "generate_workload", "percentile", "poisson_arrival_offsets", "run_bench", "summarize",
]

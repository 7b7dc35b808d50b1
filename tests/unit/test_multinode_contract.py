"""Several nodes, NVIDIA's side: the configuration, the plan, and the mpirun command line we emit,
against what NVIDIA's own launchers do (tests/data/multinode/nvidia_multinode.json, with sources).

TensorRT-LLM cannot run here, so this is where the leader-mode command line, the rendered engine
config and `trtllm-llmapi-launch` are checked; tests/integration/test_multinode_world.py runs the same
launch for real with the stand-in engine.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
from trtllm_truss.artifacts.target import target_facts
from trtllm_truss.cli import main
from trtllm_truss.runtime.cluster import planned_cluster, rank_env_args, rank_wrapper
from trtllm_truss.config import ConfigError, load_config
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.planning.plan import ServingPlan, make_plan
from trtllm_truss.repository.models import repository_configs
from trtllm_truss.runtime.stack import _prepare_world
from trtllm_truss.runtime.launch import LaunchSpec, TritonPorts, build_launch_command

REPO_ROOT = Path(__file__).resolve().parents[2]
NVIDIA = json.loads((REPO_ROOT / "tests" / "data" / "multinode" / "nvidia_multinode.json").read_text())
EXAMPLE = REPO_ROOT / "examples" / "legacy-llama31-405b-engine-tp16-2node-h100"


def _truss(tmp_path: Path, *, tp: int, node_count, accelerator: str | None = "H100:8") -> Path:
    resources = {"node_count": node_count}
    if accelerator:
        resources["accelerator"] = accelerator
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in resources.items())
    (tmp_path / "config.yaml").write_text(
        textwrap.dedent(
            """\
            resources:
            {lines}
            model_metadata:
              trt_llm:
                serve:
                  engine_repository: org/engine
                  tensor_parallel_count: {tp}
                runtime:
                  backend: tensorrtllm
            """
        ).format(lines=lines, tp=tp)
    )
    return tmp_path


# --- configuration (issue 25's goals) ----------------------------------------------------------------


def test_tp16_on_two_8_gpu_nodes_validates_and_shows_16_ranks_on_2_hosts(capsys):
    assert main(["validate", str(EXAMPLE), "--trtllm-version", "0.16.0"]) == 0
    out = capsys.readouterr().out
    assert "MPI world of 16 rank(s) on 2 node(s) x 8 GPU(s)" in out
    assert "node 0 node0: ranks 0-7 on GPUs 0-7 (leader" in out
    assert "node 1 node1: ranks 8-15 on GPUs 0-7 (worker" in out
    assert "backend tensorrtllm" in out


def test_tp8_on_two_8_gpu_nodes_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(_truss(tmp_path, tp=8, node_count=2))
    (problem,) = caught.value.problems
    assert problem.startswith("resources.node_count: 2 nodes of 8 GPUs hold 16 ranks")
    assert "fits on one node; set resources.node_count: 1" in problem


@pytest.mark.parametrize(
    ("tp", "node_count", "accelerator", "message"),
    [
        (24, 2, "H100:8", "the world must fill every node"),
        (16, 2, None, "need resources.accelerator"),
        (16, "two", "H100:8", "resources.node_count: expected an integer >= 1"),
        (16, 0, "H100:8", "resources.node_count: expected an integer >= 1"),
    ],
)
def test_node_count_problems_name_the_key(tmp_path, tp, node_count, accelerator, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_truss(tmp_path, tp=tp, node_count=node_count, accelerator=accelerator))


def test_each_node_needs_only_its_share_of_the_gpus(tmp_path):
    resolved = load_config(_truss(tmp_path, tp=16, node_count=2))
    assert resolved.node_count == 2
    facts = target_facts(8, resolved.accelerator, "0.16.0")  # one 8-GPU node, as validate plans it
    plan = make_plan(resolved, facts, artifacts_dir=tmp_path / "a")
    assert (plan.backend, plan.node_count, plan.gpus_per_node, plan.tritonserver_ranks) == ("tensorrtllm", 2, 8, 16)


def test_the_stand_in_runs_one_rank_per_gpu_of_every_node(tmp_path):
    plan = ServingPlan(
        backend="pytorch", tokenizer_dir=Path("/t"), model_dir=Path("/m"), max_batch_size=4, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(), node_count=2, gpus_per_node=1,
    )
    assert plan.tritonserver_ranks == 2
    single = ServingPlan(
        backend="pytorch", tokenizer_dir=Path("/t"), model_dir=Path("/m"), max_batch_size=4, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(),
    )
    assert single.tritonserver_ranks == 1


# --- the leader-mode command line ----------------------------------------------------------------------


def _contexts(command: list[str]) -> list[list[str]]:
    first = command.index("-n")
    contexts, current = [], []
    for arg in command[first:]:
        if arg == ":":
            contexts.append(current)
            current = []
        else:
            current.append(arg)
    return [*contexts, current]


def _two_node_command(tmp_path: Path, world: int = 4) -> list[str]:
    cluster = planned_cluster(world, 2, world // 2)
    hostfile = tmp_path / "hostfile"
    spec = LaunchSpec(
        binary=Path("/opt/tritonserver/bin/tritonserver"),
        repository=Path("/cache/repositories/abc"),
        backend_dir=Path("/opt/tritonserver/backends"),
        ports=TritonPorts(8000, 8001, 8002),
        world_size=world,
        mpi_args=tuple(cluster.mpirun_args(hostfile, agent="kubessh")),
        rank_prefix=tuple(rank_env_args({"PATH": "/bin", "NCCL_DEBUG": "INFO"}) + rank_wrapper(Path("/cache/repositories/abc/.m"), 60)),
    )
    return build_launch_command(spec)


def test_leader_mode_command_line_matches_nvidias_launcher(tmp_path):
    launcher = NVIDIA["leader_mode_launcher"]
    command = _two_node_command(tmp_path)
    assert command[:2] == launcher["mpirun_prefix"]
    assert launcher["multi_model_flag"] not in command  # orchestrator mode: one node only
    contexts = _contexts(command)
    assert len(contexts) == 4 and all(context[:2] == launcher["per_rank_context"] for context in contexts)
    for rank, context in enumerate(contexts):
        assert "--disable-auto-complete-config" in context
        assert any(arg.startswith("--backend-config=python,shm-region-prefix-name=") and arg.endswith(f"prefix{rank}_") for arg in context)
        explicit = "--model-control-mode=explicit" in context
        load_engine = f"--load-model={launcher['tensorrt_llm_model_name_default']}" in context
        assert explicit == load_engine == (rank > 0)
        if rank > 0:  # as the Kubernetes tutorial's worker ranks: no endpoints of their own
            assert set(NVIDIA["kubernetes_tutorial"]["rank_above_0_args"][:3]) <= set(context)


def test_every_rank_context_carries_the_forwarded_environment(tmp_path):
    # Open MPI 4.1 takes -x per app context (measured; recorded under open_mpi).
    assert "first app context" in NVIDIA["open_mpi"]["x_is_per_app_context"]
    command = _two_node_command(tmp_path)
    global_options = command[: command.index("-n")]
    assert "-x" not in global_options
    assert global_options[global_options.index("--mca") + 1 : global_options.index("--mca") + 3] == ["plm_rsh_agent", "kubessh"]
    for context in _contexts(command):
        forwarded = [context[i + 1] for i, arg in enumerate(context) if arg == "-x"]
        assert {"PATH", "PYTHONPATH", "NCCL_DEBUG"} <= set(forwarded)
        assert "wait-for" in context  # then the rank's own command


def test_rendered_engine_config_leaves_participants_and_devices_to_leader_mode():
    # kLEADER without participantIds needs world size == tp*pp*cp and then numbers them 0..n-1; device ids
    # would have to satisfy deviceIds * numNodes == tp*pp*cp. We set neither (the executor's defaults).
    assert "tp*pp*cp" in NVIDIA["executor_leader_mode"]["world_size_rule"]
    plan = ServingPlan(
        backend="tensorrtllm", tokenizer_dir=Path("/t"), engine_dir=Path("/e"), max_batch_size=8, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(), tensor_parallel_count=16, node_count=2, gpus_per_node=8,
    )
    engine = repository_configs(plan)["tensorrt_llm"]
    names = set(engine.parameters)
    assert not {"participant_ids", "gpu_device_ids", "num_nodes"} & names


def test_llmapi_ranks_start_through_nvidias_multi_node_launcher(tmp_path):
    recorded = NVIDIA["llmapi_launcher"]
    assert "OMPI_COMM_WORLD_RANK" in recorded["rank_variables"]  # what our mpirun sets for each rank
    plan = ServingPlan(
        backend="llmapi", tokenizer_dir=Path("/t"), model_dir=Path("/m"), max_batch_size=8, max_input_len=8,
        max_output_len=8, runtime=RuntimeConfig(), tensor_parallel_count=16, node_count=2, gpus_per_node=8,
    )
    assert plan.tritonserver_ranks == 16  # one launcher per rank, as NVIDIA's `mpirun -np N trtllm-llmapi-launch ...`
    agent = tmp_path / "agent.sh"  # every node answers at once
    agent.write_text('#!/bin/sh\nexit 0\n')
    agent.chmod(0o755)
    launch = _prepare_world(
        plan, planned_cluster(16, 2, 8), tmp_path / "repo", tmp_path, {"TRTLLM_TRUSS_MPI_LAUNCH_AGENT": str(agent)}
    )
    prefix = launch["rank_prefix"]
    assert prefix[-1] == "trtllm-llmapi-launch" and prefix.index("wait-for") < prefix.index("trtllm-llmapi-launch")
    assert (tmp_path / "hostfile").read_text() == "node0 slots=8\nnode1 slots=8\n"


def test_a_moe_checkpoint_over_two_nodes_shows_its_expert_split(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(
        textwrap.dedent(
            """\
            resources: {accelerator: "H100:8", node_count: 2}
            model_metadata:
              trt_llm:
                build:
                  base_model_architecture: deepseek
                  huggingface_ckpt_repository: deepseek-ai/DeepSeek-R1
                  tensor_parallel_count: 16
                  expert_parallel_count: 16
            """
        )
    )
    code = main(["validate", str(tmp_path), "--trtllm-version", "1.0.0"])
    out = capsys.readouterr().out
    assert "MPI world of 16 rank(s) on 2 node(s) x 8 GPU(s)" in out
    assert "MoE experts split 16 ways over the 16 ranks" in out
    assert code == 0 and "backend llmapi" in out


def test_a_tp16_engine_is_verified_against_both_nodes_gpus_and_each_nodes_ranks(tmp_path):
    from trtllm_truss.artifacts import prepare_artifacts
    from trtllm_truss.artifacts.engine_config import EngineVerificationError
    from trtllm_truss.planning.probe import GpuInfo, RuntimeFacts

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({
        "version": "0.16.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM", "dtype": "bfloat16",
            "mapping": {"world_size": 16, "tp_size": 16, "pp_size": 1},
        },
        "build_config": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_beam_width": 1},
    }))
    for rank in range(16):
        (engine / f"rank{rank}.engine").write_bytes(b"\x01" * 8)
    node = RuntimeFacts(
        gpus=(GpuInfo("NVIDIA H100 80GB HBM3", "9.0"),) * 8, trtllm_version="0.16.0", trtllm_unavailable_reason=None
    )
    plan = ServingPlan(
        backend="tensorrtllm", tokenizer_dir=tmp_path, engine_dir=engine, max_batch_size=1, max_input_len=1,
        max_output_len=1, runtime=RuntimeConfig(), tensor_parallel_count=16, facts=node, limits_final=False,
        node_count=2, gpus_per_node=8,
    )
    ready, _ = prepare_artifacts(plan)
    assert ready.limits_final and ready.max_input_len == 1024
    with pytest.raises(EngineVerificationError, match="engine needs 16 GPUs .* but 8 are visible"):
        prepare_artifacts(dataclasses.replace(plan, node_count=1, gpus_per_node=1))
    # Node 1's own volume holds only its ranks' files: enough for node 1, not for a whole world.
    for rank in range(8):
        (engine / f"rank{rank}.engine").unlink()
    prepare_artifacts(plan, engine_ranks=range(8, 16))
    with pytest.raises(EngineVerificationError, match=r"missing engine file\(s\) rank0\.engine"):
        prepare_artifacts(plan)


def test_init_from_the_two_node_example_scales_the_world_with_the_accelerator(tmp_path, capsys):
    truss_dir = tmp_path / "h200"
    assert main(["init", str(truss_dir), "--from", EXAMPLE.name, "--accelerator", "H200:8"]) == 0
    resolved = load_config(truss_dir, environ={})
    assert resolved.node_count == 2 and str(resolved.accelerator) == "H200:8"
    assert resolved.trt_llm.world_size == 16  # 8 GPUs per node x 2 nodes

"""The text of docs/scale_model.md around the cost model's tables; every figure in it comes
from cost_model_params.json, cost_model_validation.json or the model computed from them
(``make_performance_page.py`` passes them in)."""
from __future__ import annotations

from typing import Any

KiB, MiB = 1 << 10, 1 << 20
LIMIT = 0.25  # the model's goal: within 25 % of the measured time
COLUMNS = (("flat", "flat"), ("two_level", "two-level"), ("mpi", "`MPI_Allreduce`"))


def _parse(config: str) -> tuple[int, int, str]:
    shape, rate = config.split("@")
    h, g = shape.lower().split("x")
    return int(h), int(g), rate


def _t(cm: Any, s: float | None) -> str:
    return cm.fmt_t(s)


def _img(images: set[str], name: str, alt: str) -> list[str]:
    return [f"![{alt}]({name})", ""] if name in images else []


def _find(rows: list[dict], **match: Any) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def render(cm: Any, data: dict[str, Any], images: set[str]) -> str:
    params, val = data["params"], data["val"]
    vrows, erows, frows, crows = data["vrows"], data["erows"], data["frows"], data["crows"]
    clusters = [c.name for c in data["clusters"]]
    cores = params.get("cores", 2)
    out: list[str] = []
    add = out.extend

    add(["# The cost model of allreduce across hosts", "",
         "<!-- Written by benchmarks/make_performance_page.py from benchmarks/cost_model_params.json "
         "and benchmarks/cost_model_validation.json: edit those (or the script), not this page. -->", "",
         "`benchmarks/cost_model.py` predicts the time of one allreduce of S bytes on H hosts of G ranks "
         "each (P = H·G) for the algorithms below, checks the predictions against `bench_hosts.py` on "
         "hosts emulated on one machine, and extrapolates to thousands of GPUs from public figures. "
         "[Scaling across hosts](scale.md) is the user's guide to what hvdlite does across hosts; this "
         "page is the model behind its choices and how far it holds.", "",
         "Every figure here comes from two files that the model's own runs write, "
         "`benchmarks/cost_model_params.json` (the measured parameters, every raw run, when and how) and "
         "`benchmarks/cost_model_validation.json` (every `bench_hosts.py` row of the validation rounds), "
         "or from the model computed on them:", "",
         "```bash",
         "python benchmarks/cost_model.py --measure             # the parameters (root: emulated hosts)",
         "python benchmarks/cost_model.py --validate --rounds 3 # the validation rounds (root)",
         "python benchmarks/make_performance_page.py            # this page and its plots",
         "```", "",
         "`python benchmarks/cost_model.py` prints the same tables (and one JSON line per row); "
         "`tests/test_cost_model.py` checks each formula against a closed form worked out by hand.", ""])

    # ---------------------------------------------------------------- formulas
    add(["## Formulas", "",
         "A message between two ranks costs α + n/bw; reducing n bytes costs γ·n. There are two levels "
         "of link: inside a host (α_l, bw_l: shared memory on the emulated hosts, NVLink on a GPU server) "
         "and between hosts (α_x, bw_x for one stream, i.e. one NIC). A host has `nics` NICs; k streams "
         "leaving it at once each get bw_x·min(1, nics/k). \"Link bytes\" is what each host sends through "
         "its NICs, in each direction; nothing can beat link bytes / host bandwidth.", "",
         "| algorithm | time | link bytes |",
         "| --- | --- | --- |",
         "| flat ring over P ranks (hvdlite's, Horovod's MPI ring), ordered host by host | 2(P−1)·max(α_x + S/P / bw_x, α_l + S/P / bw_l) + (P−1)·S/P·γ | 2(P−1)/P·S, through one NIC |",
         "| two-level = 2D torus, per piece c: ring reduce-scatter in the host, G concurrent allreduces of c/G across hosts, ring allgather in the host | RS = (G−1)(α_l + c/G / bw_l + c/G·γ); X = 2(H−1)(α_x + c/(GH) / bw_x(G)) + (H−1)·c/(GH)·γ; AG = (G−1)(α_l + c/G / bw_l) | 2(H−1)/H·S, spread over G streams |",
         f"| … as hvdlite runs it | Σ over {cm.HVD_TWO_LEVEL_PIECE // MiB} MiB pieces of RS + X + AG, one after the other; across hosts `MPI_Allreduce` instead of the ring when c/(GH) < {cm.HVD_RING_MIN_SEGMENT // KiB} KiB (recursive doubling for small sizes, as measured; above, 2(H−1)/H of the data per rank, taken as Rabenseifner) | same |",
         "| … pipelined (levels of consecutive pieces overlap), best piece | RS+X+AG of the first piece + Σ of max(RS+AG, X) over the others, piece chosen from 64 KiB…S | same |",
         "| leader per host | reduce-scatter + gather to the leader, ring allreduce of S among the H leaders (one stream per host), scatter + allgather | 2(H−1)/H·S through one NIC |",
         f"| Open MPI 5's HAN (its `MPI_Allreduce` where hosts hold several ranks), in {cm.HAN_SEGMENT // KiB} KiB segments s | per segment: reduce to the leader lr = ⌈log₂G⌉(α_l + s/bw_l + s·γ), the leaders' ireduce ur = ⌈log₂H⌉(x(s) + s·γ) and ibcast ub = ⌈log₂H⌉·x(s), broadcast in the host lb = ⌈log₂G⌉(α_l + s/bw_l); x(s) one message between hosts. Segments overlap: iteration k runs lr(k) then lb(k−3) in the host while ur(k−1) and ub(k−2) are in flight; it costs max(lr + lb, ur, ub), over n + 3 iterations for n segments | ⌈log₂H⌉·S (the root's broadcast) |",
         "| double binary tree (NCCL), chain in the host, pipelined in steps of d bytes | Σ stage times + (S/d − 1)·slowest stage; a stage across hosts costs α_x + 2d / host_bw + d·γ, one inside α_l + 2d / bw_l; 2⌈log₂H⌉ + 2(G−1) stages; d chosen from 1 KiB…S | 2·S (interior in one tree, leaf in the other) |",
         "| recursive doubling | log₂G·(α_l + S/bw_l + S·γ) + log₂H·(α_x + S / bw_x(G) + S·γ) | log₂H·G·S |",
         "| Rabenseifner (recursive halving, then doubling; the halving steps with the large pieces inside the host) | per step with a piece p: 2(α + p/bw) + p·γ; pieces S/2, S/4, … | 2(H−1)/H·S |",
         "",
         "The control plane, per negotiation cycle:", "",
         "- **through rank 0** (Horovod without its response cache; in hvdlite, requests its cache does not "
         "know yet): 2·α + (P−1)·c, where c is rank 0's cost to receive one worker's message and answer "
         "it, one after the other;",
         "- **one bit-vector allreduce** (Horovod's response cache, and hvdlite's cycles: a bitwise AND of "
         "which cached tensors are ready): ⌈log₂G⌉·α_l + ⌈log₂H⌉·α_x by recursive doubling (a few dozen "
         "bytes: latency only), or 2(P−1)·α as a ring.", "",
         "hvdlite's own call, in the steady state that `bench_hosts.py` measures (the same name called "
         "again, so the response cache knows it), is modelled as what the code does:", "",
         "- **local cost**: the Python call, the hand-over to the engine and back: the 4-byte "
         "`hvd.allreduce_` of 2 ranks on one host less its cycle's exchange (parameters below).",
         f"- **one cycle**: a recursive-doubling allreduce over all P ranks of {cm.HVD_CYCLE_BYTES} bytes "
         "(the cache's ready and evict bits with their headers; `cache_cycle.cc`), ranks numbered host "
         "by host: ⌈log₂G⌉ exchanges inside the host, then ⌈log₂H⌉ across, where the G ranks of a host "
         "cross at once.",
         f"- A Sum or Average allreduce of up to {cm.HVD_CARRY_MAX // KiB} KiB rides in that cycle "
         "(`CacheCycle::kMaxCarriedBytes`): its bytes join the cycle's message and nothing else runs. A "
         "larger one runs the flat or two-level algorithm after the cycle.", "",
         "Two measured refinements apply to the emulated hosts only (the public clusters of the "
         "extrapolation keep α + n/bw):", "",
         "- **Small messages between hosts are per-message costs.** One exchange both ways between two "
         "emulated hosts, one call after a barrier with the token bucket full (as `bench_hosts.py` "
         "calls), is measured from 8 bytes to 64 KiB (`cost_model.py --measure-small`) and "
         "interpolated; α_x + n/bw_x applies above 64 KiB. TCP over the emulation's virtual links "
         "costs per message and per packet, not per byte, at these sizes.",
         "- **Open MPI with two ranks on two hosts** makes one exchange (recursive doubling) at some "
         "sizes and two exchanges of half the buffer at others: the same probe times `MPI_Allreduce` at "
         "each size and takes the step count whose time it is nearer to (the parameters below give both). "
         "This is Open MPI 5's fixed decision for two ranks; the model uses it wherever two ranks on two "
         "hosts run `MPI_Allreduce` (2 × 1). HAN's leaders (2 × G) run an ireduce and an ibcast, one "
         "message each, instead.", "",
         "Scaling efficiency of a data-parallel step (weak scaling: the batch per GPU is fixed): "
         "E = T_compute / (T_compute + T_exposed + T_control), with T_exposed = T_allreduce without "
         "overlap, or max(0, T_allreduce − ⅔·T_compute) when the allreduce may hide under the backward "
         "pass (⅔ of the compute), and T_control two negotiation cycles (one per 64 MiB bucket).", ""])

    # ---------------------------------------------------------------- parameters
    shm, ctl, em = params["shm"], params["control"], params["emulated"]
    add(["## Parameters", "",
         f"Measured here by `python benchmarks/cost_model.py --measure` ({params.get('measured', '?')}, "
         f"commit `{params.get('commit', '?')}`, medians over rounds, on {cores} cores; every raw run is "
         "in the file):", "",
         cm.md_params(params), ""])
    notes = [f"- The shared-memory figures are for 2 processes on the machine's {cores} cores. A ring's "
             "steps are exchanges (both ranks send and receive at once), so bw comes from `MPI_Sendrecv`."]
    effs = sorted({e["payload_efficiency"] for e in em.values()})
    if effs:
        notes.append(f"- The emulated link's payload rate is {effs[0]:.3f}"
                     + (f"–{effs[-1]:.3f}" if effs[-1] - effs[0] > 0.0005 else "")
                     + " of the `tc` rate: 1448 bytes of TCP payload in each 1514-byte frame that the token "
                     "bucket counts.")
    for rate, e in em.items():
        fitted, conf = e.get("burst_fitted"), e.get("burst_configured")
        if fitted and conf and abs(fitted / conf - 1) > 0.5:
            notes.append(f"- At {rate}, TCP over the virtual links moves only {e['wire_bw'] / 1e9:.2f} GB/s even in a "
                         f"burst, barely above the {e['rate'] / 1e9:.2f} GB/s rate, so the fit cannot tell the "
                         f"bucket ({fitted / 1e6:.1f} MB fitted) and the configured {conf / 1e6:.2f} MB is used: "
                         "this emulation is limited by the CPU, not by the token bucket.")
        elif fitted and conf:
            notes.append(f"- At {rate}, the fitted bucket ({fitted / 1e6:.2f} MB) matches what "
                         f"`tests/hosts/emulated.py` configures ({conf / 1e6:.2f} MB, 10 ms at the rate).")
    tcp = [v for k, v in ctl.items() if k.startswith("rank0_per_message_") and not k.endswith("shm")]
    notes.append(f"- Rank 0's cost per message comes from mpi4py, so it includes Python's cost per call; "
                 "hvdlite's engine does the same in C++ for less."
                 + (f" Over TCP the same loop costs {min(tcp) * 1e6:.1f}–{max(tcp) * 1e6:.1f} µs per message: "
                    "each receive and each send is a system call." if tcp else ""))
    add(notes + [""])
    add(["Public figures for the extrapolation (8 GPUs per host):", "",
         "| quantity | value | source |",
         "| --- | --- | --- |",
         "| NVLink 4 per GPU | 900 GB/s both ways together: bw_l = 450 GB/s each way; α_l = 3 µs per step (assumed: NCCL's per-hop cost, not the wire's) | MLCommons system description, `mlcommons/inference_results_v4.1` `closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json` (\"18x 4th Gen NVLink, 900GB/s\") |",
         "| NDR InfiniBand | 400 Gb/s = 50 GB/s per NIC; 8 NICs per 8-GPU host (rail-optimized) or 1; α_x = 5 µs per step (assumed; switch port-to-port latency is below 0.4 µs, the rest is software) | `mlcommons/inference_results_v3.1` `closed/Dell/systems/XE9680_H100_SXM_80GBx8_TRT.json` (\"8x 400Gb Infiniband\"); systemspecbase.com/infiniband-ndr-400g-throughput-and-switch-port-density/ |",
         "| 100 GbE | 12.5 GB/s per host, α_x = 10 µs (assumed: between RDMA's ~1 µs and TCP's 20–50 µs) | malgukke.de/expertise/nodecommu.html |",
         "| GPU reduction γ | 3 bytes of HBM traffic per byte reduced at 3.35 TB/s: 0.9 ps/B | H100 SXM HBM3 bandwidth (NVIDIA's H100 product page) |",
         "| ResNet-50 step | 25,557,032 fp32 parameters = 102 MB of gradients (`benchmarks/resnet50_shapes.py`); batch 256 per GPU at 2,470 img/s (one A100 80GB, mixed precision) = 104 ms of compute; a GPU 3× faster (34.5 ms) as the H100-class case, an assumption | `NVIDIA/DeepLearningExamples` `PyTorch/Classification/ConvNets/resnet50v1.5/README.md` |",
         "| two-level = 2D torus | rings in two dimensions (inside the host, across hosts) | Mikami et al., \"Massively Distributed SGD: ImageNet/ResNet-50 Training in a Flash\", arXiv:1811.05233 |",
         "| tree and ring in NCCL | NCCL picks tree or ring (and protocol) per size, number of nodes and bandwidths | NVIDIA/nccl#754 (maintainer's answer) |",
         "| bit-vector agreement | Horovod's response cache: every cycle, a bitwise-AND allreduce across ranks of which cached tensors are ready | `horovod/horovod` `horovod/common/controller.cc` (`CoordinateCacheAndState`) |",
         "| Open MPI's allreduce across hosts | HAN (priority 35) over tuned (30) for communicators that span hosts | `ompi_info --param coll all --level 9` (Open MPI 5.0.11) |",
         f"| HAN's allreduce | four stages per segment: reduce in the host, ireduce and ibcast among the leaders, broadcast in the host, consecutive segments overlapped; segments of {cm.HAN_SEGMENT // KiB} KiB (`coll_han_allreduce_segsize`), libnbc between the leaders, tuned inside the host | `ompi/mca/coll/han/coll_han_allreduce.c` (Open MPI 5), `ompi_info --param coll han --level 9` |",
         ""])

    # ---------------------------------------------------------------- validation
    runs = [r for r in val.get("runs", []) if "rows" in r]
    configs = list(dict.fromkeys(r["config"] for r in vrows))
    add(["## Validation on the emulated hosts", ""])
    if runs:
        starts = sorted(r["started"] for r in runs)
        commits = sorted({r.get("commit", "?") for r in runs})
        rounds = max((r.get("round", 0) for r in runs), default=0) + 1
        kept = [r for r in runs if r.get("foreign_cpu_share", 0) <= cm.FOREIGN_MAX]
        add([f"`{val.get('about', {}).get('command', 'python benchmarks/cost_model.py --validate')}` ran "
             f"`bench_hosts.py` on {len(configs)} configurations ({', '.join(configs)}; sizes "
             f"{', '.join(dict.fromkeys(cm.fmt_b(r['bytes']) for r in vrows))}), {rounds} rounds, one configuration "
             f"per call so that a disturbed minute spoils one sample of each: {starts[0][:16].replace('T', ' ')} to "
             f"{starts[-1][:16].replace('T', ' ')} UTC, commit{'s' if len(commits) > 1 else ''} "
             f"{', '.join(f'`{c}`' for c in commits)}. The driver records how much of the CPU other processes "
             f"took while each round ran; rounds over {cm.FOREIGN_MAX * 100:.0f} % are left out ({len(runs) - len(kept)} "
             f"of {len(runs)} here). The rounds under `earlier_runs` in the file measured other code and are not used.", ""])
    add(["Measured: the median of the rounds' medians (\"±\": the rounds spread by more than 30 %). The model "
         "predicts what `bench_hosts.py` reports: hvdlite's call as above (local cost, the cycle, and above "
         f"{cm.HVD_CARRY_MAX // KiB} KiB the flat or two-level allreduce with their real pieces and thresholds: "
         f"{cm.HVD_FLAT_PIECE // MiB} MiB flat pieces, {cm.HVD_TWO_LEVEL_PIECE // MiB} MiB two-level pieces, "
         f"`MPI_Allreduce` below {cm.HVD_RING_MIN_SEGMENT // KiB} KiB ring segments), and Open MPI's "
         "`MPI_Allreduce` on 2 hosts (on 4 hosts its choice of algorithm is not modelled: \"-\"). The token "
         "bucket is followed repetition by repetition from full, and so is the order of the two ops in each "
         "repetition (the one that goes first finds the tokens). \"link\" says whether the median repetition "
         "ran on tokens (`burst`) or waited for the link's payload rate (`rate`); `edge` where the bucket runs "
         "dry in the middle of a size's repetitions, so that of the two middle ones (whose mean is the median "
         "of an even count) one ran on tokens and one at the rate.", "",
         cm.md_validation(vrows), ""])
    add(cm.validation_summary(vrows) + [""])
    add(_img(images, "scale_validation.png", "measured against modelled"))

    misses = []
    for r in vrows:
        for key, title in COLUMNS:
            e = r.get(f"{key}_error")
            if e is not None and abs(e) > LIMIT:
                misses.append((r, key, title, e))
    H_G = {c: _parse(c) for c in configs}
    crowded = [m for m in misses if H_G[m[0]["config"]][0] * H_G[m[0]["config"]][1] > cores]
    alone = [c for c in configs if H_G[c][0] * H_G[c][1] <= cores]
    cells = lambda cs: sum(1 for r in vrows if r["config"] in cs for k, _ in COLUMNS if r.get(f"{k}_error") is not None)
    ok = lambda cs: sum(1 for r in vrows if r["config"] in cs for k, _ in COLUMNS
                        if r.get(f"{k}_error") is not None and abs(r[f"{k}_error"]) <= LIMIT)
    add(["### Where the model misses", "",
         f"{len(misses)} of {cells(configs)} cells are outside {LIMIT * 100:.0f} %; {len(crowded)} of them in "
         f"configurations that run more ranks than the machine's {cores} cores."
         + (f" Where every rank has a core of its own ({', '.join(alone)}), {ok(alone)} of {cells(alone)} cells "
            f"are within {LIMIT * 100:.0f} %." if alone else ""), ""])
    if misses:
        trs = [f"| {r['config']} | {cm.fmt_b(r['bytes'])} | {title} | {cm.fmt_t(r[f'{key}_measured_s'])} | "
               f"{cm.fmt_t(r[f'{key}_model_s'])} | {cm.fmt_e(e)} | {r.get(f'{key}_regime', '')} |"
               for r, key, title, e in misses]
        add(["| config | size | column | measured | model | error | link |", "| --- | --- | --- | --- | --- | --- | --- |"]
            + trs + [""])
    add(["What the misses have in common:", "",
         "- **More ranks than cores.** The model stretches a whole path by ranks ÷ cores. Waking several "
         "processes in turn for each of the cycle's exchanges costs more than that at 4 and 64 KiB (the "
         "model is fast there), while HAN's leader stages, which not every rank takes part in, cost less "
         "(the model is slow).",
         "- **TCP on the CPU at 10 Gbit/s.** The emulated 10 Gbit/s link is limited by the CPU that runs TCP, "
         "not by its token bucket, and the flat ring's rounds are bimodal: in the fast mode the ranks that "
         "carry the TCP hops run at nearly wire speed while the others wait, faster than the stretched model.",
         "- **The token bucket's edge.** Where the bucket runs dry halfway through a size's repetitions "
         "(`edge`), the median is the mean of one repetition on tokens and one at the rate, and small "
         "differences in when it runs dry move it a lot.",
         "- **Open MPI on 4 hosts.** Which algorithms Open MPI's `MPI_Allreduce` combines on 4 hosts from "
         "1 MiB up is not modelled; hvdlite's flat allreduce, which calls it for small ring segments, "
         "inherits that.", ""])
    pair = params.get("pair_exchange", {})
    if pair:
        lines = []
        for rate, p in sorted(pair.items()):
            lines.append(f"at {rate}, {p['factor']:.2f} × sending first and "
                         f"{p.get('sendrecv_factor', float('nan')):.2f} × as `MPI_Sendrecv` "
                         f"({p.get('sendrecv_slow_fraction', 0) * 100:.0f} % of its exchanges over 1.5 ×)")
        add(["### One connection, both ways", "",
             "Two ranks on two hosts have one TCP connection between them. For a large message Open MPI sends "
             "a request and waits for the receiver's answer before the rest; `MPI_Sendrecv` posts its receive "
             "before its send, so a rank that comes to an exchange late answers its peer's request first, and "
             "its own request then waits behind the peer's whole message: its message starts a whole message "
             "late. hvdlite's ring (flat, and across hosts in the two-level allreduce) and Adasum's exchanges "
             "post the send first (`MPI_Isend`, `MPI_Irecv`, `MPI_Waitall`; "
             "`hvdlite/csrc/backends/mpi/exchange.h`), which lets the late rank's request through. "
             "`cost_model.py --measure-pair-exchange` times 2 MiB exchanges back to back between 2 hosts × 1 "
             "rank both ways, against what the rate allows: " + "; ".join(lines) + ". The model applies the "
             "first to hvdlite's pieces after the first; it does not model how Open MPI's own allreduce cuts "
             "its exchanges.", ""])

    # ---------------------------------------------------------------- extrapolation
    def e(cluster: int, hosts: int, size: int, alg: str) -> float | None:
        r = _find(erows, cluster=clusters[cluster], hosts=hosts, bytes=size)
        return None if r is None else r[f"{alg}_s"]

    add(["## Extrapolation to thousands of GPUs", "",
         "Three networks of 8-GPU hosts with NVLink inside (sources above): " + "; ".join(clusters)
         + ". Modelled time per allreduce (bold: the fastest):", "",
         cm.md_extrapolation(erows)])
    add(_img(images, "scale_winner.png", "which algorithm wins") + _img(images, "scale_time_vs_size.png", "time against size"))
    big, small = 100 * 10**6, 64 * KiB
    add(["Where each algorithm wins, by the model:", "",
         f"- **Small messages at any scale: logarithmic algorithms.** Recursive doubling (or a tree) costs "
         f"log₂P latencies; every ring pays 2(P−1) of them (the flat ring: {_t(cm, e(0, 128, small, 'flat_ring'))} "
         f"for 64 KiB at 1,024 GPUs) or 2(H−1) for the ring across hosts (the 2D torus: "
         f"{_t(cm, e(0, 128, small, 'two_level'))}). hvdlite's two-level allreduce sends its small pieces across "
         f"hosts through `MPI_Allreduce`, which is why \"hvdlite 2-level\" takes "
         f"{_t(cm, e(0, 128, small, 'two_level_hvdlite'))} there.",
         f"- **Large messages on a few hosts: the two-level allreduce (2D torus)**, which reaches the bandwidth "
         f"bound 2(H−1)/H·S over all of a host's NICs: 100 MB on 16 GPUs with one NIC per GPU takes "
         f"{_t(cm, e(0, 2, big, 'two_level'))}, against {_t(cm, e(0, 2, big, 'flat_ring'))} for the flat ring and "
         f"{_t(cm, e(0, 2, big, 'leader'))} for the leader, which push everything through one NIC.",
         f"- **Large messages on hundreds of hosts: the double binary tree and Rabenseifner.** They have the "
         f"torus's bandwidth term with log H latency instead of 2(H−1) per piece: 100 MB at 1,024 GPUs takes "
         f"{_t(cm, e(0, 128, big, 'tree'))} (tree) and {_t(cm, e(0, 128, big, 'rabenseifner'))} (Rabenseifner) "
         f"against {_t(cm, e(0, 128, big, 'two_level'))} for the best-pipelined torus (one NIC per GPU). "
         "Rabenseifner is modelled ideally (powers of two, no congestion between distant hosts); NCCL ships "
         "ring and tree.",
         "- **The flat ring and the leader never win** with 8 GPUs per host: the flat ring for its 2(P−1) "
         "latencies and single NIC, the leader for its single NIC and the extra steps inside the host.",
         f"- **hvdlite's {cm.HVD_TWO_LEVEL_PIECE // MiB} MiB pieces in series** cost little on a few hosts but "
         f"add their latencies inside the host once per piece: 100 MB on 16 GPUs takes "
         f"{_t(cm, e(0, 2, big, 'two_level_hvdlite'))} against {_t(cm, e(0, 2, big, 'two_level'))} for the "
         "best-pipelined torus. Pieces that grow with the message, and levels that overlap, are what the "
         "model says would help at scale.", ""])

    # ---------------------------------------------------------------- efficiency
    def f(cluster: int, hosts: int, compute: str, alg: str, key: str) -> float | None:
        r = next((x for x in frows if x["cluster"] == clusters[cluster] and x["hosts"] == hosts
                  and x["compute"].startswith(compute) and x["algorithm"] == alg), None)
        return None if r is None else r[key]

    def fx(v: float | None) -> str:
        return "–" if v is None else f"{v:.3f}"

    over = [x["eff_overlap_bitvector"] for x in frows if x["hosts"] == 128 and x["compute"].startswith("A100")
            and x["algorithm"] != "flat_ring"]
    add(["## Scaling efficiency: a 2D-ring allreduce at a thousand GPUs", "",
         "Scaling efficiency (as defined under Formulas) of a ResNet-50 step with fp32 gradients in 64 MiB "
         "buckets (Horovod's fusion threshold: 2 allreduces per step) and 2 control-plane cycles per step. "
         "Each cell: without overlap / with the allreduce overlapped with the backward pass, the control "
         "plane a bit-vector allreduce; the last column puts the control plane through rank 0 instead (2D "
         "torus, overlapped). \"hvdlite 2-level\" follows hvdlite's rules (pieces in series, "
         "`MPI_Allreduce` across hosts for small segments).", "",
         cm.md_efficiency(frows), ""])
    add(_img(images, "scale_efficiency.png", "scaling efficiency"))
    add(["By the model, efficiency above 0.90 at a thousand GPUs holds only under conditions:", "",
         f"- **With overlap** every algorithm but the flat ring stays at or above {min(over):.3f} at 1,024 "
         "GPUs of A100 speed on all three networks; the question is then the control plane (below)." if over else "",
         f"- **Without overlap**, the 2D torus gives {fx(f(0, 128, 'A100', 'two_level', 'eff_no_overlap_bitvector'))} "
         f"at 1,024 A100-speed GPUs with one 400 Gb/s NIC per GPU, "
         f"{fx(f(1, 128, 'A100', 'two_level', 'eff_no_overlap_bitvector'))} with one per host and "
         f"{fx(f(2, 128, 'A100', 'two_level', 'eff_no_overlap_bitvector'))} on 100 GbE; with a GPU 3× faster "
         f"{fx(f(0, 128, '3x', 'two_level', 'eff_no_overlap_bitvector'))}, "
         f"{fx(f(1, 128, '3x', 'two_level', 'eff_no_overlap_bitvector'))} and "
         f"{fx(f(2, 128, '3x', 'two_level', 'eff_no_overlap_bitvector'))}.",
         f"- **With the control plane through rank 0**, the overlapped efficiency is capped by the negotiation "
         f"instead: {fx(f(0, 128, 'A100', 'two_level', 'eff_overlap_rank0'))} at 1,024 GPUs and "
         f"{fx(f(0, 512, 'A100', 'two_level', 'eff_overlap_rank0'))} at 4,096 (A100 speed).",
         f"- The flat ring alone falls to {fx(f(0, 128, 'A100', 'flat_ring', 'eff_no_overlap_bitvector'))} at "
         "1,024 GPUs without overlap: the reason for the hierarchy in the first place.", ""])

    # ---------------------------------------------------------------- control plane
    add(["## The control plane at scale", "",
         f"One negotiation cycle, with rank 0's measured {ctl['rank0_per_message_shm'] * 1e6:.2f} µs per worker "
         "message (mpi4py on shared memory: receive, answer) and the networks' latencies:", "",
         cm.md_control(crows), ""])
    add(_img(images, "scale_control_plane.png", "control plane"))
    # Where a cycle through rank 0 outlasts Horovod's 1 ms cycle time (the first network).
    first = data["clusters"][0]
    over_ms = next((P for P in range(2, 1 << 20) if cm.rank0_cycle(P, first.inter.alpha, ctl["rank0_per_message_shm"]) > 1e-3),
                   None)
    r1k = _find(crows, cluster=clusters[0], ranks=1024)
    r4k = _find(crows, cluster=clusters[0], ranks=4096)
    bits = [r["bitvector_tree_s"] for r in crows if r["ranks"] == 1024]
    if r1k and r4k and bits:
        add([f"Through rank 0 the cycle grows linearly: {_t(cm, r1k['rank0_s'])} at 1,024 ranks, "
             f"{_t(cm, r4k['rank0_s'])} at 4,096"
             + (f", longer than Horovod's 1 ms cycle time from {over_ms:,} ranks on" if over_ms else "")
             + ", so rank 0 can no longer keep up and every tensor waits for it, whatever the network. A "
             f"bit-vector allreduce by recursive doubling costs log₂P latencies: {_t(cm, min(bits))}–"
             f"{_t(cm, max(bits))} at 1,024 ranks; as a ring it would be worse than rank 0. hvdlite runs the "
             "recursive-doubling cycle for every request its response cache knows (`docs/architecture.md`, "
             "\"Steady-state negotiation\"); rank 0 then handles only what is new, which in the steady state of "
             "training is nothing.", ""])

    # ---------------------------------------------------------------- limits
    add(["## What the model does not do", "",
         "- Congestion in the network (all algorithms are modelled on a non-blocking fat tree; Rabenseifner's "
         "and the tree's distant partners would share uplinks otherwise), stragglers and jitter: at a "
         "thousand GPUs the slowest rank of each step sets the pace, which no α–β model captures.",
         "- NCCL's protocols (LL, LL128, Simple), channels and SHARP/NVLS in-network reduction; the NVLink and "
         "InfiniBand latencies per step are assumptions, stated above.",
         "- On the emulated hosts: TCP's behaviour behind the rate limiter; how the cores are shared when ranks "
         "outnumber them (one stretch for the whole path); TCP's own CPU cost, which sets the pace at "
         "10 Gbit/s; and which algorithms Open MPI's `MPI_Allreduce` combines on 4 hosts from 1 MiB up (its "
         "column is left empty there).",
         "- GPUs: no GPU measurement enters the model; NVLink and InfiniBand rest on the public figures above.", ""])
    while out and out[-1] == "":
        out.pop()
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text + "\n"

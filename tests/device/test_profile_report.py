"""tools/device/profile_report.py on hand-written profiler output in the two formats the profile stage reads (ncu's
raw CSV page and nsys's cuda_gpu_trace CSV): kernels split into forward passes at each embedding_kernel, their
times, spans and the host's gaps as computed by hand, and a file without kernels refused. The formats are as the
tools document them; the profile stage has not yet run on a GPU machine."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "device" / "profile_report.py"

NCU_CSV = """==PROF== Connected to process 4242 (/tmp/strata-device/run/bin/strata)
==PROF== Profiling "embedding_kernel" - 0: 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","nsecond"
"0","4242","strata","gpu","void strata::cuda::embedding_kernel(const float*, int)","1","13","(128, 1, 1)","(1, 1, 1)","0","9.0","2,000"
"1","4242","strata","gpu","void strata::cuda::gemv_kernel<4>(const bf16*, float*)","1","13","(128, 1, 1)","(96, 1, 1)","0","9.0","10,500"
"2","4242","strata","gpu","void strata::cuda::gemv_kernel<4>(const bf16*, float*)","1","13","(128, 1, 1)","(96, 1, 1)","0","9.0","9,500"
"3","4242","strata","gpu","rmsnorm_kernel","1","13","(256, 1, 1)","(1, 1, 1)","0","9.0","1000"
"4","4242","strata","gpu","void strata::cuda::embedding_kernel(const float*, int)","1","13","(128, 1, 1)","(1, 1, 1)","0","9.0","3000"
"5","4242","strata","gpu","rmsnorm_kernel","1","13","(256, 1, 1)","(1, 1, 1)","0","9.0","500"
==PROF== Disconnected from process 4242
"""

NSYS_CSV = """Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),Bytes (MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name
1000,4000,10,,,,,,,,,,0.004,1000.0,Pageable,Device,NVIDIA H100 (0),1,13,[CUDA memcpy Host-to-Device]
10000,2000,11,1,1,1,128,1,1,32,0.000,0.000,,,,,NVIDIA H100 (0),1,13,void strata::cuda::embedding_kernel(const float *, int)
13000,5000,12,96,1,1,128,1,1,80,0.000,0.017,,,,,NVIDIA H100 (0),1,13,void strata::cuda::gemv_kernel<4>(const bf16 *, float *)
20000,1000,13,1,1,1,256,1,1,40,0.000,0.000,,,,,NVIDIA H100 (0),1,13,rmsnorm_kernel
30000,2000,14,1,1,1,128,1,1,32,0.000,0.000,,,,,NVIDIA H100 (0),1,13,void strata::cuda::embedding_kernel(const float *, int)
40000,6000,15,96,1,1,128,1,1,80,0.000,0.017,,,,,NVIDIA H100 (0),1,13,void strata::cuda::gemv_kernel<4>(const bf16 *, float *)
"""


def run(tool, text, tmp_path):
    source = tmp_path / f"{tool}.csv"
    source.write_text(text)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"results": [{"decode_tokens_per_second": 50.0}]}))
    proc = subprocess.run([sys.executable, str(SCRIPT), tool, str(source), str(report)], capture_output=True,
                          text=True)
    return proc, json.loads(report.read_text())


def test_ncu_kernels_are_summed_per_forward_pass(tmp_path):
    proc, report = run("ncu", NCU_CSV, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report["results"] == [{"decode_tokens_per_second": 50.0}]  # the bench's report is kept
    profile = report["profile"]
    assert profile["tool"] == "ncu" and profile["kernels"] == 6
    first, second = profile["passes"]
    assert first["kernels"] == 4 and first["gpu_seconds"] == pytest.approx(23_000e-9)
    assert first["top"][0][0] == "strata::cuda::gemv_kernel<4>"
    assert first["top"][0][1] == pytest.approx(20_000e-9)
    assert second["kernels"] == 2 and second["gpu_seconds"] == pytest.approx(3_500e-9)
    assert "span_seconds" not in first  # ncu serialises kernels: no timeline


def test_nsys_trace_gives_spans_and_the_hosts_gaps(tmp_path):
    proc, report = run("nsys", NSYS_CSV, tmp_path)
    assert proc.returncode == 0, proc.stderr
    profile = report["profile"]
    assert profile["kernels"] == 5  # the memory copy is not a kernel
    first, second = profile["passes"]
    # Pass 1: kernels at 10,000 (2,000 ns), 13,000 (5,000), 20,000 (1,000): span 10,000 to 21,000.
    assert first["gpu_seconds"] == pytest.approx(8_000e-9)
    assert first["span_seconds"] == pytest.approx(11_000e-9)
    assert first["idle_seconds"] == pytest.approx(3_000e-9)
    # Pass 2: 30,000 (2,000), 40,000 (6,000): span 30,000 to 46,000.
    assert second["gpu_seconds"] == pytest.approx(8_000e-9)
    assert second["span_seconds"] == pytest.approx(16_000e-9)
    assert second["idle_seconds"] == pytest.approx(8_000e-9)


def test_a_file_without_kernels_is_refused(tmp_path):
    proc, report = run("ncu", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n", tmp_path)
    assert proc.returncode != 0 and "no kernel" in proc.stderr
    assert "profile" not in report


def test_a_named_key_keeps_each_profile_beside_the_others(tmp_path):
    source = tmp_path / "ncu.csv"
    source.write_text(NCU_CSV)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"runs": []}))
    for key in ("profile_batch_1", "profile_batch_64"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "ncu", str(source), str(report), key],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    assert "profile" not in data
    assert data["profile_batch_1"]["kernels"] == 6 and data["profile_batch_64"]["kernels"] == 6


def test_launch_shapes_keep_one_kernels_matrix_products_apart(tmp_path):
    proc, report = run("ncu", NCU_CSV, tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = report["profile"]["passes"][0]
    # The two gemv launches share a grid: one shape, two launches, their times summed.
    assert first["top_launches"][0][0] == "strata::cuda::gemv_kernel<4> grid (96,1,1)"
    assert first["top_launches"][0][1] == pytest.approx(20_000e-9) and first["top_launches"][0][2] == 2
    proc, report = run("nsys", NSYS_CSV, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report["profile"]["passes"][0]["top_launches"][0][0] == "strata::cuda::gemv_kernel<4> grid (96,1,1)"

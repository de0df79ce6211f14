#!/usr/bin/env python3
"""Tests of make_results.py without a GPU: fake run directories in Google Benchmark's JSON form.

    python3 benchmarks/make_results_test.py      (ctest: make_results_test, label cpu)

What is checked: rows of a newer run replace an older run's rows of the same shape and keep the
older run's other shapes; DIR=NAME,... takes only the named binaries from DIR (none of its peers or
status lines); tagged parts (NAME.TAG.json) join their binary; `of floor` is the median over the
floor; and the bad inputs (a missing directory, DIR= with no name, a name DIR does not hold) stop
with exit status 2 and a message naming the directory and the binary.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "make_results.py")


def row(name, us, floor_us, **counters):
    """One median aggregate row as Google Benchmark writes it (manual time, the harness counters)."""
    out = {"name": name + "/manual_time_median", "run_name": name + "/manual_time", "run_type": "aggregate",
           "aggregate_name": "median", "real_time": us, "cpu_time": us, "time_unit": "us", "us": us,
           "floor_us": floor_us, "frac_of_floor": floor_us / us, "bytes": 1e6, "flops": 0.0}
    out.update(counters)
    return out


def write_run(path, files, status=None, peers=None, commit="abc1234"):
    os.makedirs(path)
    for name, rows in files.items():
        with open(os.path.join(path, name + ".json"), "w") as f:
            json.dump({"context": {"host_name": "test"}, "benchmarks": rows}, f)
    with open(os.path.join(path, "env.json"), "w") as f:
        json.dump({"gpus": ["0, Test GPU"], "commit": commit, "command": "run_all.sh"}, f)
    if status is not None:
        with open(os.path.join(path, "status.txt"), "w") as f:
            f.write(status)
    if peers is not None:
        with open(os.path.join(path, "peers.jsonl"), "w") as f:
            for p in peers:
                f.write(json.dumps(p) + "\n")


class MakeResultsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.old = os.path.join(self.dir, "2026-01-01-h200")
        self.new = os.path.join(self.dir, "2026-01-02-h200")
        write_run(self.old, {
            "alpha_benchmark": [row("BM_A/size:1/iterations:10", 10.0, 5.0),
                                row("BM_A/size:2/iterations:10", 20.0, 5.0)],
            "beta_benchmark": [row("BM_B/size:1/iterations:10", 40.0, 20.0)],
        }, status="alpha_benchmark: rc=0\nbeta_benchmark: rc=124 (timed out), partial\n",
            peers=[{"benchmark": "BM_B", "params": {"size": 1}, "peer": "torch", "us": 400.0}])
        write_run(self.new, {
            "alpha_benchmark": [row("BM_A/size:1/iterations:10", 8.0, 4.0)],
            "beta_benchmark.part2": [row("BM_B/size:3/iterations:10", 50.0, 25.0)],
        }, status="alpha_benchmark: rc=0\n", commit="def5678")

    def tearDown(self):
        self.tmp.cleanup()

    def run_tool(self, *indirs):
        md = os.path.join(self.dir, "R.md")
        proc = subprocess.run([sys.executable, SCRIPT, "--in", *indirs, "--out-md", md, "--out-png",
                               os.path.join(self.dir, "r.png"), "--notes", os.path.join(self.dir, "none.md"),
                               "--no-matplotlib"], capture_output=True, text=True)
        text = ""
        if proc.returncode == 0:
            with open(md) as f:
                text = f.read()
        return proc, text

    @staticmethod
    def table_rows(text, bench):
        """The data lines of one benchmark's table, split into cells."""
        lines = text.split("### `" + bench + "`", 1)[1].split("\n\n", 2)[1].splitlines()
        return [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:] if l.startswith("|")]

    def test_newer_rows_replace_older_of_the_same_shape(self):
        proc, text = self.run_tool(self.old, self.new)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        rows = self.table_rows(text, "BM_A")
        self.assertEqual([(r[0], r[1], r[2]) for r in rows],
                         [("1", "2026-01-02-h200", "8.00"), ("2", "2026-01-01-h200", "20.0")])
        self.assertEqual(rows[0][4], "0.5")  # of floor = 4 / 8
        # The tagged part joins beta_benchmark beside the older run's shape; the peer column stays.
        beta = self.table_rows(text, "BM_B")
        self.assertEqual(sorted(r[0] for r in beta), ["1", "3"])
        self.assertIn("torch", text.split("### `BM_B`", 1)[1].split("\n\n", 2)[1].splitlines()[0])
        self.assertIn("beta_benchmark: rc=124 (timed out), partial", text)

    def test_dir_equals_names_takes_only_those_binaries(self):
        proc, text = self.run_tool(self.old + "=beta_benchmark", self.new)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual([r[0] for r in self.table_rows(text, "BM_A")], ["1"])  # size 2 was only in old
        self.assertEqual(sorted(r[0] for r in self.table_rows(text, "BM_B")), ["1", "3"])
        self.assertIn("rows taken from it: beta_benchmark only", text)
        self.assertNotIn("rc=124", text)  # the restricted run's status lines are not shown
        self.assertNotIn("torch", text)   # nor its peers

    def test_bad_inputs_name_the_directory_and_binary(self):
        missing = os.path.join(self.dir, "nope")
        proc, _ = self.run_tool(missing)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(f"--in {missing}: not a directory", proc.stderr)
        proc, _ = self.run_tool(self.old + "=")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("no binary named after '='", proc.stderr)
        proc, _ = self.run_tool(self.old + "=gamma_benchmark")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("gamma_benchmark has no NAME[.TAG].json in " + self.old, proc.stderr)
        self.assertIn("it has: alpha_benchmark, beta_benchmark", proc.stderr)


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Tests of make_results.py without a GPU: fake run directories in Google Benchmark's JSON form.

    python3 benchmarks/make_results_test.py      (ctest: make_results_test, label cpu)

What is checked: rows of a newer run replace an older run's rows of the same shape and keep the
older run's other shapes; DIR=NAME,... takes only the named binaries from DIR (none of its peers or
status lines); tagged parts (NAME.TAG.json) join their binary; `of floor` is the median over the
floor; and the bad inputs (a missing directory, DIR= with no name, a name DIR does not hold) stop
with exit status 2 and a message naming the directory and the binary. The summary: the targets file's
targets open the page, before the runs and tables, each case's figure, fraction of the floor and peer
read from the runs and its goal evaluated; hand-measured cases and end-to-end tables as written; a case
whose row is absent says so; a malformed targets file stops with exit status 2. Model ids of the step
and MoE benchmarks are shown by name; a peer joins every form of its shape (BM_MoeDecode's join); the notes file is linked, never copied in; the header names the
command that regenerates the page.
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

    def run_tool(self, *indirs, targets=None, notes=None):
        md = os.path.join(self.dir, "R.md")
        proc = subprocess.run([sys.executable, SCRIPT, "--in", *indirs, "--out-md", md, "--out-png",
                               os.path.join(self.dir, "r.png"), "--notes", notes or os.path.join(self.dir, "none.md"),
                               "--targets", targets or os.path.join(self.dir, "no-targets.json"),
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

    def write_targets(self, targets):
        path = os.path.join(self.dir, "targets.json")
        with open(path, "w") as f:
            json.dump(targets, f)
        return path

    def test_summary_opens_the_page_with_figures_read_from_the_runs(self):
        targets = self.write_targets({
            "intro": "Where the targets stand.",
            "targets": [
                {"target": "A at its floor", "goal": {"metric": "frac_of_floor", "min": 0.4},
                 "verdict": "met at size 1 only",
                 "cases": [{"case": "size 1", "bench": "BM_A", "params": {"size": 1}},
                           {"case": "size 2", "bench": "BM_A", "params": {"size": 2}},
                           {"case": "size 9", "bench": "BM_A", "params": {"size": 9}}]},
                {"target": "B against the peer", "goal": {"metric": "peer_speedup", "min": 5},
                 "verdict": "met", "cases": [{"case": "size 1", "bench": "BM_B", "params": {"size": 1}}]},
                {"target": "C by hand", "verdict": "missed",
                 "cases": [{"case": "script run", "figure": "123 µs/token", "meets": False}]}],
            "notes": ["Causes: {notes}."],
            "end_to_end": [{"title": "End-to-end X", "text": "How X was measured.", "columns": ["batch", "speedup"],
                            "rows": [["1", "1.80×"]], "command": "./measure.sh OUT", "source": "runs/x"}]})
        proc, text = self.run_tool(self.old, self.new, targets=targets)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # The summary comes first: before the runs and the tables.
        self.assertLess(text.index("## Summary"), text.index("## Runs"))
        self.assertLess(text.index("## Runs"), text.index("## Tables"))
        summary = text.split("## Summary", 1)[1].split("## Runs", 1)[0]
        self.assertIn("Where the targets stand.", summary)
        rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in summary.splitlines()
                if l.startswith("| ") and not l.startswith("| target")]
        # BM_A size 1 is the newer run's row (8 µs, floor 4: 0.5 >= 0.4); size 2 the older run's (0.25).
        self.assertEqual(rows[0], ["A at its floor (≥ 0.4 of floor)", "size 1", "8.00 µs", "0.5", "—", "yes",
                                   "met at size 1 only"])
        self.assertEqual(rows[1][1:6], ["size 2", "20.0 µs", "0.25", "—", "no"])
        self.assertEqual(rows[1][0], "")
        self.assertEqual(rows[2][1:3], ["size 9", "not in these runs"])
        # The peer's 400 µs against our 40 µs: 10× >= 5.
        self.assertEqual(rows[3][2:6], ["40.0 µs", "0.5", "400 µs (10.0×)", "yes"])
        self.assertEqual(rows[4][1:], ["script run", "123 µs/token", "—", "—", "no", "missed"])
        self.assertIn("Causes: [none.md](none.md).", summary)
        self.assertIn("### End-to-end X", summary)
        self.assertIn("| 1 | 1.80× |", summary)
        self.assertIn("Command: `./measure.sh OUT`. Data: runs/x.", summary)

    def test_a_malformed_targets_file_is_refused(self):
        targets = self.write_targets({"targets": [{"target": "no cases"}]})
        proc, _ = self.run_tool(self.old, targets=targets)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("targets[0]: needs 'target' (text) and 'cases' (a list)", proc.stderr)
        targets = self.write_targets({"targets": [{"target": "t", "goal": {"metric": "speed", "min": 1}, "cases": []}]})
        proc, _ = self.run_tool(self.old, targets=targets)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("targets[0].goal", proc.stderr)

    def test_without_a_targets_file_the_page_says_so(self):
        proc, text = self.run_tool(self.old)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("No targets file (benchmarks/targets.json) was found", text)

    def test_notes_are_linked_not_copied(self):
        notes = os.path.join(self.dir, "NOTES.md")
        with open(notes, "w") as f:
            f.write("# Notes\n\nA development journal entry that stays in the notes.\n")
        proc, text = self.run_tool(self.old, notes=notes)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("development journal entry", text)
        self.assertIn("[NOTES.md](NOTES.md)", text)

    def test_header_names_the_command_that_regenerates_the_page(self):
        proc, text = self.run_tool(self.old + "=beta_benchmark", self.new)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        line = next(l for l in text.splitlines() if l.startswith("Regenerate"))
        self.assertIn("python3 benchmarks/make_results.py --in ", line)
        self.assertIn("2026-01-01-h200=beta_benchmark ", line)
        self.assertIn("2026-01-02-h200 ", line)
        self.assertIn("--no-matplotlib", line)

    def test_console_logs_convert_in_both_counter_forms(self):
        sys.path.insert(0, HERE)
        import console_to_json
        keyed = console_to_json.convert([
            "Benchmark   Time   CPU   Iterations UserCounters...",
            "BM_Q/shape:0/m:1/manual_time_mean  6.93 us  119 us  5 GB/s=1.59k floor_us=2.6 us=6.9152 v3_q_a",
            "BM_Q/shape:0/m:1/manual_time_median  6.92 us  118 us  5 GB/s=1.59328k floor_us=2.59971 us=6.912 v3_q_a",
        ])["benchmarks"]
        self.assertEqual(len(keyed), 1)  # the median only
        self.assertEqual(keyed[0]["run_name"], "BM_Q/shape:0/m:1/manual_time")
        self.assertAlmostEqual(keyed[0]["GB/s"], 1593.28)
        self.assertAlmostEqual(keyed[0]["us"], 6.912)
        self.assertAlmostEqual(keyed[0]["floor_us"], 2.59971)
        self.assertEqual(keyed[0]["label"], "v3_q_a")
        tabular = console_to_json.convert([
            "Benchmark   Time   CPU   Iterations floor_us us",
            "BM_Q/shape:1/manual_time_median  5.0 us  9 us  5 2.5 5.0",
        ])["benchmarks"]
        self.assertEqual(tabular[0]["floor_us"], 2.5)
        self.assertEqual(tabular[0]["us"], 5.0)

    def test_models_are_named(self):
        step = os.path.join(self.dir, "2026-01-03-h200")
        write_run(step, {"decode_step_benchmark": [
            row("BM_DecodeStep/model:0/batch:1/context:1024/graph:1", 5000.0, 1000.0, cache_elem_bytes=4),
            row("BM_DecodeStep/model:1/batch:1/context:1024/graph:1", 11000.0, 1500.0, cache_elem_bytes=4)],
            "decode_ops_benchmark": [dict(row("BM_MoeDecode/model:2/tokens:4", 130.0, 86.0), label="V2Lite-TP1")]})
        proc, text = self.run_tool(step)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual([r[0] for r in self.table_rows(text, "BM_DecodeStep")], ["v2lite-tp1", "v2-tp8-rank"])
        moe = self.table_rows(text, "BM_MoeDecode")
        self.assertEqual(moe[0][:3], ["v2lite-tp1", "4", "130"])  # the name replaces both the id and the label
        self.assertNotIn("| label |", text)

    def test_a_peer_joins_every_form_of_its_shape(self):
        run = os.path.join(self.dir, "2026-01-04-h200")
        write_run(run, {"decode_ops_benchmark": [
            row("BM_MoeDecode/model:2/tokens:1/join:0", 60.0, 30.0),
            row("BM_MoeDecode/model:2/tokens:1/join:1", 50.0, 30.0)]},
            peers=[{"benchmark": "BM_MoeDecode", "params": {"model": 2, "tokens": 1}, "peer": "torch", "us": 500.0}])
        proc, text = self.run_tool(run)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        moe = self.table_rows(text, "BM_MoeDecode")
        self.assertEqual(len(moe), 2)
        for r in moe:
            self.assertIn("500", r, r)


if __name__ == "__main__":
    unittest.main()

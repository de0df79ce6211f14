#!/usr/bin/env python3
"""CPU unit tests of tools/train_tiny (run: python3 tools/train_tiny/test_train_tiny.py)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import draft  # noqa: E402
import draft_mla  # noqa: E402
import export  # noqa: E402
import target  # noqa: E402
import tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

CODE = [
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n    y: int = 0\n",
    "import os\nfor name in os.listdir('.'):\n\tif name.endswith('.py'):\n        print(name, 12345)\n",
    "x = {'key': [1, 2, 3]}  # it's a dict\r\nvalue = x['key'][0] ** 2\f\v\n",
]


class TokenizerTest(unittest.TestCase):
    def setUp(self):
        docs = [data.Document(f"/x/{i}.py", f"{i}.py", text) for i, text in enumerate(CODE * 50)]
        self.tok, self.info = tokenizer.train_tokenizer(docs, vocab_size=300)

    def test_round_trip_and_special_token(self):
        for text in CODE:
            ids = self.tok.encode(text, add_special_tokens=False).ids
            self.assertEqual(self.tok.decode(ids), text)
        self.assertEqual(self.tok.token_to_id(data.EOT), 0)

    def test_pre_tokenizer_splits(self):
        # A space joins the following identifier; the last of several spaces does too; digits split.
        pieces = [p for p, _ in self.tok.pre_tokenizer.pre_tokenize_str("a  bc 12x it's")]
        self.assertEqual(pieces, ["a", "Ġ", "Ġbc", "Ġ12", "x", "Ġit", "'s"])

    def test_check_spec_refuses_a_deviation(self):
        from tokenizers import pre_tokenizers
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        with self.assertRaises(SystemExit):
            tokenizer.check_spec(self.tok, 300)


class DataTest(unittest.TestCase):
    def test_heldout_is_a_property_of_the_path(self):
        paths = [f"pkg/mod{i}.py" for i in range(2000)]
        held = [p for p in paths if data.is_heldout(p)]
        self.assertEqual(held, [p for p in paths if data.is_heldout(p)])
        self.assertTrue(20 <= len(held) <= 60, len(held))  # ~1 in 50

    def test_pack_and_windows(self):
        stream = data.pack([np.array([5, 6], np.int32), np.array([7], np.int32)], 0)
        self.assertEqual(stream.tolist(), [5, 6, 0, 7, 0])
        self.assertEqual(data.fixed_windows(stream, 2, 10).tolist(), [[5, 6], [0, 7]])
        with self.assertRaises(ValueError):
            data.WindowSampler(stream, 5, 0)

    def test_sampler_is_seeded(self):
        stream = np.arange(1000, dtype=np.int32)
        a, b = data.WindowSampler(stream, 16, 3).batch(4), data.WindowSampler(stream, 16, 3).batch(4)
        self.assertTrue(torch.equal(a, b))
        self.assertTrue(torch.equal(a[:, 1:], a[:, :-1] + 1))


class DraftTest(unittest.TestCase):
    def setUp(self):
        self.hub = target.target_hub_config(64, 0)
        self.hub.update({"hidden_size": 64, "max_position_embeddings": 128})
        self.dc = draft.draft_hub_config(self.hub, 16)

    def test_forward_matches_reference(self):
        self.assertLess(draft.check_against_reference(self.dc, 1, num_steps=4, rows=9), 1e-4)

    def test_reference_check_catches_wrong_positions(self):
        # TTT step j at RoPE position p instead of p + j: the check must fail.
        original = draft.Eagle3Draft.rope
        draft.Eagle3Draft.rope = lambda self, positions: original(self, positions - positions[0])
        try:
            with self.assertRaises(SystemExit):
                draft.check_against_reference(self.dc, 1, num_steps=3, rows=9)
        finally:
            draft.Eagle3Draft.rope = original

    def test_vocab_map_offsets(self):
        stream = np.array([3, 3, 3, 9, 9, 1, 7, 7, 7, 7], dtype=np.int32)
        d2t, t2d, coverage = draft.vocab_map(stream, 12, 3)
        self.assertEqual((torch.arange(3) + d2t).tolist(), [3, 7, 9])
        self.assertEqual(t2d.nonzero().flatten().tolist(), [3, 7, 9])
        self.assertAlmostEqual(coverage, 0.9)

    def test_ttt_targets_and_agreement(self):
        logits = torch.full((1, 6, 8), -5.0)
        logits[0, torch.arange(6), torch.tensor([1, 2, 3, 4, 5, 6])] = 5.0
        draft_ids = torch.tensor([1, 2, 3, 4])
        targets = draft.ttt_targets(logits, 2, 4, draft_ids)
        # Step j reads target positions 1 + j .. j + T.
        self.assertEqual(targets[0][2].tolist(), [[2, 3, 4, 5]])
        self.assertEqual(targets[1][1].tolist(), [[True, True, False, False]])
        draft_logits = torch.zeros(1, 4, 4)
        draft_logits[0, torch.arange(4), torch.tensor([1, 2, 3, 0])] = 1.0  # target ids 2, 3, 4, 1
        agree = draft.agreement([(draft_logits, None)], targets[:1], draft_ids)
        self.assertAlmostEqual(agree[0].item(), 0.75)


def tiny_hub():
    hub = target.target_hub_config(64, 0)
    hub.update({"hidden_size": 64, "max_position_embeddings": 128})
    return hub


class MlaDraftTest(unittest.TestCase):
    def setUp(self):
        self.dc = draft_mla.mla_draft_hub_config(tiny_hub(), 16)

    def test_forward_matches_reference(self):
        self.assertLess(draft_mla.check_against_reference(self.dc, 1, num_steps=4, rows=9), 1e-4)

    def test_forward_matches_reference_without_q_lora(self):
        dc = dict(self.dc, q_lora_rank=None)
        self.assertLess(draft_mla.check_against_reference(dc, 2, num_steps=3, rows=7), 1e-4)
        self.assertIn("q_proj.weight", "".join(draft_mla.MlaEagle3Draft(dc, torch.randn(64, 64)).state_dict()))

    def test_reference_check_catches_neox_rope(self):
        # Rotating (i, i + d/2) pairs instead of DeepSeek's adjacent pairs: the check must fail.
        original = draft_mla.rotate_adjacent
        draft_mla.rotate_adjacent = draft.rotate_half
        try:
            with self.assertRaises(SystemExit):
                draft_mla.check_against_reference(self.dc, 1, num_steps=2, rows=6)
        finally:
            draft_mla.rotate_adjacent = original

    def test_names_and_shapes_are_eagle3s_schema(self):
        golden = draft.import_make_golden()
        state = draft_mla.MlaEagle3Draft(self.dc, torch.randn(64, 64)).state_dict()
        want = golden.mla_draft_weight_shapes(self.dc, draft.LAYER_PREFIX)
        self.assertEqual(sorted(state), sorted(n for n, _ in want))
        for name, shape in want:
            self.assertEqual(tuple(state[name].shape), tuple(shape), name)

    def test_config_for_the_shipped_target(self):
        with open(os.path.join(REPO, "models", "tiny-v2-code", "config.json")) as f:
            hub = json.load(f)
        dc = draft_mla.mla_draft_hub_config(hub, 2048)
        self.assertEqual(dc["architectures"], ["Eagle3DeepseekV2ForCausalLM"])
        self.assertIn(dc["model_type"], ("deepseek_v2", "deepseek_v3", "kimi_k2"))
        self.assertEqual(dc["num_attention_heads"] % 8, 0)  # TP 8
        self.assertEqual(dc["kv_lora_rank"] + dc["qk_rope_head_dim"], hub["kv_lora_rank"] + hub["qk_rope_head_dim"])
        # The key set of the golden MLA draft eagle3's tests load, nothing else.
        with open(os.path.join(REPO, "tests", "data", "golden", "mla_draft_k25", "config.json")) as f:
            golden_keys = set(json.load(f))
        self.assertEqual(set(dc), golden_keys)

    def test_export_round_trip(self):
        d2t = torch.arange(16) * 3 - torch.arange(16)  # target ids 0, 3, ..., 45
        embed = torch.randn(64, 64)
        model = draft_mla.MlaEagle3Draft(self.dc, embed, d2t)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        target.round_to_bf16(model)
        with tempfile.TemporaryDirectory() as out:
            directory = export.export_draft(out, model, self.dc, export.MLA_DRAFT_DIR)
            self.assertEqual(os.path.basename(directory), "tiny-v2-code-eagle3-mla")
            export.verify_draft(directory, model)
            with open(os.path.join(directory, "config.json")) as f:
                dc = json.load(f)
            self.assertEqual(dc, json.loads(json.dumps(self.dc)))
            from safetensors.torch import load_file
            stored = load_file(os.path.join(directory, "model.safetensors"))
            self.assertEqual(stored["t2d"].nonzero().flatten().tolist(), list(range(0, 48, 3)))
            reloaded = draft_mla.MlaEagle3Draft(dc, embed, stored.pop("d2t"))
            stored.pop("t2d")
            reloaded.load_state_dict({n: w.float() for n, w in stored.items()})
            self.assertTrue(torch.equal(reloaded.d2t, d2t))
            aux, tokens = torch.randn(1, 6, 3 * 64), torch.randint(0, 64, (1, 7))
            with torch.no_grad():
                want, got = model.forward_ttt(aux, tokens, 2), reloaded.forward_ttt(aux, tokens, 2)
            for (a, _), (b, _) in zip(want, got):
                self.assertTrue(torch.equal(a, b))
            sizes = export.mla_draft_size(out)
            self.assertEqual(sizes["weights_bytes"], os.path.getsize(os.path.join(directory, "model.safetensors")))


class ExportTest(unittest.TestCase):
    def test_hub_names_round_trip_through_make_golden_mapping(self):
        hub = target.target_hub_config(64, 0)
        hub.update({"hidden_size": 64, "num_hidden_layers": 2})
        model = target.build_model(hub, torch.device("cpu"), attn="eager")
        golden = draft.import_make_golden()
        state = target.to_hub_state(model, hub)
        self.assertEqual(sorted(state), sorted(n for n, _ in golden.weight_shapes(hub)))
        back = golden.hub_to_transformers(hub, state)
        for name, w in model.state_dict().items():
            self.assertTrue(torch.equal(back[name], w), name)

    def test_verify_draft_refuses_inconsistent_d2t(self):
        hub = target.target_hub_config(64, 0)
        hub.update({"hidden_size": 64})
        dc = draft.draft_hub_config(hub, 16)
        d2t = torch.arange(16) * 2 - torch.arange(16)  # target ids 0, 2, ..., 30
        model = draft.Eagle3Draft(dc, torch.randn(64, 64), d2t)
        target.round_to_bf16(model)
        with tempfile.TemporaryDirectory() as out:
            directory = export.export_draft(out, model, dc)
            export.verify_draft(directory, model)
            model.d2t[3] = 100  # maps draft id 3 outside the target vocab
            with self.assertRaisesRegex(SystemExit, r"d2t\[3\] = 100 maps draft id 3 to target id 103"):
                export.export_draft(out, model, dc)
            model.d2t[3] = 2 - 3  # draft ids 1 and 3 both map to target id 2
            with self.assertRaisesRegex(SystemExit, "same target id"):
                export.export_draft(out, model, dc)


class CommandLineTest(unittest.TestCase):
    def test_cuda_without_a_device_is_refused(self):
        if torch.cuda.is_available():
            self.skipTest("this host has CUDA")
        import train
        with self.assertRaises(SystemExit) as ctx:
            train.parse_args(["/tmp/unused", "--device", "cuda"])
        self.assertEqual(ctx.exception.code, 2)

    def test_check_cpp_names_a_missing_tool(self):
        import check_cpp
        with tempfile.TemporaryDirectory() as build:
            with self.assertRaisesRegex(SystemExit, "eagle3-inspect not found under"):
                check_cpp.find_tool(build, "eagle3-inspect")

    def test_size_budget_is_enforced(self):
        with tempfile.TemporaryDirectory() as out:
            for name, size in ((export.TARGET_DIR, 20_000_000), (export.DRAFT_DIR, 4_000_000)):
                os.makedirs(os.path.join(out, name))
                with open(os.path.join(out, name, "model.safetensors"), "wb") as f:
                    f.truncate(size)
            with self.assertRaisesRegex(SystemExit, "over the 23000000 byte budget"):
                export.sizes(out)

    def test_train_sh_without_out_dir_is_a_usage_error(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.sh")
        proc = subprocess.run([script], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("usage", proc.stderr)


class WriteCardRunsTest(unittest.TestCase):
    """The card's end-to-end rows (decode_runs.sh summaries) and its tie_check.py sentence."""

    def test_decode_runs_and_tie_check(self):
        import write_card
        with tempfile.TemporaryDirectory() as tmp:
            summary = os.path.join(tmp, "summary.txt")
            with open(summary, "w") as f:
                f.write("per-token cost = ...\n"
                        "loop      plain us/tok  spec us/tok  speedup  accept len  speedup/len  syncs/step  D2H B/step\n"
                        "device           593.8        364.1     1.63        2.99         0.55         1.0        80.0\n")
            row = write_card.read_decode_runs_summary(summary)
            self.assertEqual((row["plain_us"], row["spec_us"], row["speedup"], row["accept_len"]),
                             (593.8, 364.1, 1.63, 2.99))
            table = "\n".join(write_card.decode_runs_section([f"MLA,1,{summary}"]))
            self.assertIn("| MLA | 1 | 593.8 | 364.1 | **1.63x** | 2.99 |", table)
            ties = os.path.join(tmp, "ties.jsonl")
            with open(ties, "w") as f:
                f.write(json.dumps({"weights": "bf16", "prompts": 4, "identical": 3,
                                    "differing": [{"prompt": 2, "first_differing_token": 7}]}) + "\n")
                f.write(json.dumps({"weights": "f32", "prompts": 4, "identical": 4, "differing": []}) + "\n")
            text = "\n".join(write_card.tie_check_lines(ties))
            self.assertIn("3/4 identical at bf16 weight storage (prompt 2 from its token 7) and 4/4 at f32", text)


class TrainMlaDraftTest(unittest.TestCase):
    """train_mla_draft.py end to end at a tiny budget: a corpus of a few files (data.corpus_roots patched),
    the shipped target (only read), a few draft steps on CPU."""

    def test_train_only_the_mla_draft(self):
        import train_mla_draft
        import write_card
        target_dir = os.path.join(REPO, "models", "tiny-v2-code")
        weights = os.path.join(target_dir, "model.safetensors")
        before = train_mla_draft.sha256(weights)
        sources = sorted(f for f in os.listdir(HERE) if f.endswith(".py"))
        heldout_name = next(f"h{i}.py" for i in range(10000) if data.is_heldout(f"h{i}.py"))
        original_roots = data.corpus_roots
        with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as out:
            for i, name in enumerate(sources):
                shutil.copy(os.path.join(HERE, name), os.path.join(root, f"m{i}_{name}"))
            shutil.copy(os.path.join(HERE, "draft.py"), os.path.join(root, heldout_name))
            data.corpus_roots = lambda: [("stdlib", root)]
            try:
                train_mla_draft.main([out, "--target", target_dir, "--device", "cpu", "--budget-seconds", "30",
                                      "--draft-steps", "3", "--warmup", "1", "--seq-len", "32",
                                      "--draft-batch-size", "2", "--ttt-steps", "2", "--eval-windows", "2",
                                      "--max-train-mb", "1"])
            finally:
                data.corpus_roots = original_roots
            self.assertEqual(train_mla_draft.sha256(weights), before)
            directory = os.path.join(out, "tiny-v2-code-eagle3-mla")
            self.assertEqual(sorted(os.listdir(directory)), ["config.json", "model.safetensors"])
            with open(os.path.join(out, "train_log_mla.json")) as f:
                log = json.load(f)
            with open(os.path.join(REPO, "models", "train_log.json")) as f:
                shipped = json.load(f)
            # The draft fields of train.py's log, and the Llama-style draft evaluated on the same windows.
            self.assertLessEqual(set(shipped["draft"]), set(log["draft"]))
            self.assertGreater(log["draft"]["train"]["steps"], 0)  # the cap, or run_budgeted's 4 timing steps
            self.assertEqual(len(log["draft"]["eval"]["top1_agreement_per_depth"]), 2)
            self.assertEqual(len(log["llama_draft"]["eval"]["top1_agreement_per_depth"]), 2)
            self.assertEqual(log["heldout_prompt"]["path"], os.path.join(root, heldout_name))
            self.assertIn("## MLA draft", "\n".join(write_card.mla_section(log, None, [], [])))

    def test_train_mla_draft_sh_without_out_dir_is_a_usage_error(self):
        proc = subprocess.run([os.path.join(HERE, "train_mla_draft.sh")], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("usage", proc.stderr)

    def test_missing_target_files_are_refused(self):
        import train_mla_draft
        with tempfile.TemporaryDirectory() as empty:
            with self.assertRaises(SystemExit) as ctx:
                train_mla_draft.parse_args(["/tmp/unused", "--target", empty, "--device", "cpu"])
            self.assertEqual(ctx.exception.code, 2)


if __name__ == "__main__":
    unittest.main()

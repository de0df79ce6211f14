#!/usr/bin/env python3
"""CPU unit tests of tools/train_tiny (run: python3 tools/train_tiny/test_train_tiny.py)."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import draft  # noqa: E402
import export  # noqa: E402
import target  # noqa: E402
import tokenizer  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()

// The C++ tokenizer against HF `tokenizers`: tests/data/tokenizer/ holds a small tokenizer trained
// with the built-in model's pipeline and the ids `tokenizers` gives for edge cases, random strings
// and held-out Python sources (tools/tokenizer_fixture.py). Every tokenizer.json FromJson refuses
// has a test here.
//
// EAGLE3_TOKENIZER_CHECK=<tokenizer.json>:<cases.json> checks one more case file, as written by
// tools/check_tokenizer.py (e.g. the trained model's tokenizer over all held-out files).
#include "eagle3/tools/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "scoped_temp_dir.h"
#include "tokenizer_byte_level.h"
#include "tokenizer_code_split.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kDataDir = std::string(EAGLE3_TEST_DATA_DIR) + "/tokenizer";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

const json& FixtureJson() {
  static const json* const document = new json(json::parse(ReadFile(kDataDir + "/tokenizer.json")));
  return *document;
}

const Tokenizer& Fixture() {
  static const Tokenizer* const tokenizer = [] {
    auto loaded = Tokenizer::FromFile(kDataDir + "/tokenizer.json");
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return new Tokenizer(*std::move(loaded));
  }();
  return *tokenizer;
}

// Checks every case of a cases.json (tools/check_tokenizer.py's format) against `tokenizer_path`.
void CheckCaseFile(const std::string& tokenizer_path, const std::string& cases_path) {
  SCOPED_TRACE(cases_path);
  auto tokenizer = Tokenizer::FromFile(tokenizer_path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const json cases = json::parse(ReadFile(cases_path));
  ASSERT_EQ(tokenizer->vocab_size(), cases.at("vocab_size").get<int64_t>());
  int failures = 0;
  for (const json& c : cases.at("encode")) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int64_t> expected = c.at("ids").get<std::vector<int64_t>>();
    const auto ids = tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != expected) {
      ADD_FAILURE() << c.at("name").get<std::string>() << ": ids differ from tokenizers' for "
                    << json(text).dump();
      if (++failures > 10) return;
      continue;
    }
    const auto decoded = tokenizer->Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text) << c.at("name").get<std::string>();
  }
  for (const json& c : cases.at("decode")) {
    const std::vector<int64_t> ids = c.at("ids").get<std::vector<int64_t>>();
    const bool skip = c.at("skip_special_tokens").get<bool>();
    const auto text = tokenizer->Decode(
        ids, skip ? Tokenizer::SpecialTokens::kSkip : Tokenizer::SpecialTokens::kKeep);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c.at("text").get<std::string>()) << c.at("ids").dump() << " skip " << skip;
  }
}

TEST(TokenizerTest, MatchesTokenizersOnFixtureCases) {
  const json cases = json::parse(ReadFile(kDataDir + "/cases.json"));
  ASSERT_GE(cases.at("encode").size(), 300u);  // synthetic, random strings, held-out snippets
  ASSERT_GE(cases.at("decode").size(), 300u);
  CheckCaseFile(kDataDir + "/tokenizer.json", kDataDir + "/cases.json");
}

TEST(TokenizerTest, IgnoreMergesEmitsWholeWordTokens) {
  // The fixture gains " return_value" (no merge builds it) and ignore_merges: only the whole-word
  // lookup can produce it.
  CheckCaseFile(kDataDir + "/tokenizer_ignore_merges.json", kDataDir + "/cases_ignore_merges.json");
  auto tokenizer = Tokenizer::FromFile(kDataDir + "/tokenizer_ignore_merges.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::optional<int64_t> id = tokenizer->TokenId("\xC4\xA0return_value");  // "Ġreturn_value"
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*tokenizer->Encode(" return_value"), std::vector<int64_t>{*id});
  EXPECT_GT(Fixture().Encode(" return_value")->size(), 1u);
}

TEST(TokenizerTest, ExtraCaseFileFromEnvironment) {
  const char* spec = std::getenv("EAGLE3_TOKENIZER_CHECK");
  if (spec == nullptr || *spec == '\0') {
    GTEST_SKIP() << "set EAGLE3_TOKENIZER_CHECK=<tokenizer.json>:<cases.json> to check a case file";
  }
  const std::string value(spec);
  const size_t colon = value.rfind(':');
  ASSERT_NE(colon, std::string::npos)
      << "EAGLE3_TOKENIZER_CHECK must be <tokenizer.json>:<cases.json>";
  CheckCaseFile(value.substr(0, colon), value.substr(colon + 1));
}

TEST(TokenizerTest, VocabularyAccessors) {
  const Tokenizer& t = Fixture();
  EXPECT_EQ(t.vocab_size(), 1000);
  EXPECT_EQ(t.TokenId("<|endoftext|>"), 0);
  EXPECT_EQ(t.Token(0), "<|endoftext|>");
  EXPECT_TRUE(t.IsSpecial(0));
  EXPECT_FALSE(t.IsSpecial(1));
  EXPECT_FALSE(t.IsSpecial(-1));
  EXPECT_FALSE(t.IsSpecial(1000));
  EXPECT_EQ(t.TokenId("\xC4\xA0"), FixtureJson()["model"]["vocab"]["\xC4\xA0"].get<int64_t>());
  EXPECT_EQ(t.TokenId("no such token"), std::nullopt);
  EXPECT_EQ(t.Token(1000), std::nullopt);
  EXPECT_EQ(t.Token(-1), std::nullopt);
  // Special tokens split the text even when glued to words; nothing is added around the text.
  const auto ids = t.Encode("a<|endoftext|>b");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 3u);
  EXPECT_EQ((*ids)[1], 0);
  EXPECT_EQ(*t.Decode(*ids, Tokenizer::SpecialTokens::kSkip), "ab");
  EXPECT_EQ(*t.Decode(*ids), "a<|endoftext|>b");
}

TEST(TokenizerTest, RefusesInvalidUtf8NamingTheOffset) {
  const struct {
    std::string text;
    size_t offset;
  } cases[] = {
      {"ab\xFF", 2},               // never a UTF-8 byte
      {"\x80", 0},                 // lone continuation byte
      {"x\xC0\xAF", 1},            // overlong '/'
      {"xy\xE0\x80\x80", 2},       // overlong 3-byte form
      {"\xED\xA0\x80", 0},         // surrogate U+D800
      {"ok \xF4\x90\x80\x80", 3},  // above U+10FFFF
      {"abc\xE2\x82", 3},          // truncated at the end
      {"\xC3(", 0},                // lead byte without its continuation
      {"\xF5\x80\x80\x80", 0},     // F5 starts nothing
  };
  for (const auto& c : cases) {
    const auto ids = Fixture().Encode(c.text);
    ASSERT_FALSE(ids.ok()) << json::binary(std::vector<uint8_t>(c.text.begin(), c.text.end()));
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ids.status().message(), HasSubstr("offset " + std::to_string(c.offset) + " "));
    EXPECT_THAT(ids.status().message(), HasSubstr("not valid UTF-8"));
  }
  // The largest code points of each length are fine.
  EXPECT_TRUE(Fixture().Encode("\x7F\xDF\xBF\xEF\xBF\xBF\xF4\x8F\xBF\xBF").ok());
}

TEST(TokenizerTest, DecodeRefusesOutOfRangeIdsNamingPositionAndId) {
  const std::vector<std::vector<int64_t>> cases = {{5, 1000}, {5, -1}, {5, int64_t{1} << 40}};
  for (const auto& ids : cases) {
    const auto text = Fixture().Decode(ids);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(),
                HasSubstr("ids[1] = " + std::to_string(ids[1]) + " is out of range [0, 1000)"));
  }
}

TEST(TokenizerTest, DecodeReplacesIllFormedBytesLikeFromUtf8Lossy) {
  // Single-byte tokens make any byte string; each maximal ill-formed subpart is one U+FFFD.
  const std::string kReplacement = "\xEF\xBF\xBD";
  const auto decode_bytes = [&](const std::string& bytes) {
    std::vector<int64_t> ids;
    for (char b : bytes) {
      ids.push_back(Fixture().TokenId(tokenizer_internal::ToByteLevel(std::string(1, b))).value());
    }
    return Fixture().Decode(ids).value();
  };
  EXPECT_EQ(decode_bytes("A"), "A");
  EXPECT_EQ(decode_bytes("\xE2\x82"
                         "A"),
            kReplacement + "A");
  EXPECT_EQ(decode_bytes("\xF0\x80"), kReplacement + kReplacement);
  EXPECT_EQ(decode_bytes("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(decode_bytes("\xF0\x9F\x98"), kReplacement);
  EXPECT_EQ(decode_bytes("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

// Pieces as `tokenizers`' pre_tokenize_str gives them for the same pattern (checked by hand).
std::vector<std::string> Pieces(std::string_view text) {
  std::vector<std::string> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = tokenizer_internal::CodeSplitPieceLength(text, pos);
    pieces.emplace_back(text.substr(pos, length));
    pos += length;
  }
  return pieces;
}

TEST(TokenizerTest, SplitFollowsOnigurumaBacktracking) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("   x"), (V{"  ", " x"}));
  EXPECT_EQ(Pieces("foo  "), (V{"foo", "  "}));
  EXPECT_EQ(Pieces("a\v\vb"), (V{"a", "\v", "\v", "b"}));
  EXPECT_EQ(Pieces("\t x"), (V{"\t", " x"}));
  EXPECT_EQ(Pieces(" \tx"), (V{" ", "\t", "x"}));
  EXPECT_EQ(Pieces("x's 'S '' 'll"), (V{"x", "'s", " '", "S", " ''", " '", "ll"}));
  EXPECT_EQ(Pieces("abc123 4_5"), (V{"abc123", " 4", "_5"}));
  EXPECT_EQ(Pieces("a\u00a0b\u3000c"), (V{"a", "\u00a0", "b", "\u3000", "c"}));
  EXPECT_EQ(Pieces("a\u2028 b"), (V{"a", "\u2028", " b"}));
  EXPECT_EQ(
      Pieces("  \n\n    def f(x):\n        return x's  "),
      (V{"  \n\n   ", " def", " f", "(", "x", "):", "\n       ", " return", " x", "'s", "  "}));
}

TEST(TokenizerTest, ByteLevelAlphabet) {
  using tokenizer_internal::ByteLevelChar;
  EXPECT_EQ(ByteLevelChar(' '), U'\u0120');
  EXPECT_EQ(ByteLevelChar('\n'), U'\u010A');
  EXPECT_EQ(ByteLevelChar(0x00), U'\u0100');
  EXPECT_EQ(ByteLevelChar(0x7F), U'\u0121');
  EXPECT_EQ(ByteLevelChar(0xA0), U'\u0142');
  EXPECT_EQ(ByteLevelChar(0xAD), U'\u0143');
  EXPECT_EQ(ByteLevelChar('a'), U'a');
  EXPECT_EQ(ByteLevelChar(0xE9), U'\u00E9');
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(tokenizer_internal::ByteLevelByte(ByteLevelChar(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(tokenizer_internal::ByteLevelByte(U'\u0144'), std::nullopt);
  EXPECT_EQ(tokenizer_internal::ByteLevelByte(U' '), std::nullopt);
}

TEST(TokenizerTest, AcceptsMergesInTheOlderStringForm) {
  json doc = FixtureJson();
  for (json& merge : doc["model"]["merges"]) {
    merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }
  auto tokenizer = Tokenizer::FromJson(doc.dump(), "string merges");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = ReadFile(kDataDir + "/cases.json");
  EXPECT_EQ(*tokenizer->Encode(text), *Fixture().Encode(text));
}

TEST(TokenizerTest, FromFileAcceptsTheDirectoryAndNamesAMissingFile) {
  auto from_dir = Tokenizer::FromFile(kDataDir);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ(from_dir->vocab_size(), 1000);
  ScopedTempDir dir;
  const auto missing = Tokenizer::FromFile(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("tokenizer.json: no such file"));
}

TEST(TokenizerTest, EncodesAMegabyteQuickly) {
  // Correctness of the result is covered above; this guards against a quadratic path (a 1 MB
  // single piece included). The bound is loose: a sanitizer build must pass too.
  std::string text;
  const std::string source = ReadFile(kDataDir + "/cases.json");
  while (text.size() < (1u << 20)) text += source;
  const std::string one_piece(1u << 20, 'a');
  const auto start = std::chrono::steady_clock::now();
  const auto ids = Fixture().Encode(text);
  const auto piece_ids = Fixture().Encode(one_piece);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok());
  ASSERT_TRUE(piece_ids.ok());
  EXPECT_EQ(*Fixture().Decode(*ids), text);
  EXPECT_EQ(*Fixture().Decode(*piece_ids), one_piece);
  EXPECT_LT(seconds, 20.0);
}

// ---- Refusals: each mutation of the fixture's tokenizer.json must be refused, naming the key and
// ---- the value found.

struct Refusal {
  std::string name;
  std::function<void(json&)> mutate;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class TokenizerRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(TokenizerRefusalTest, RefusesWithKeyAndValue) {
  json doc = FixtureJson();
  GetParam().mutate(doc);
  const auto tokenizer = Tokenizer::FromJson(doc.dump(), "tok.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), GetParam().code) << tokenizer.status();
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("tok.json"));
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(part));
  }
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

json& PreTokenizerStep(json& doc, int i) { return doc["pre_tokenizer"]["pretokenizers"][i]; }

INSTANTIATE_TEST_SUITE_P(
    Mutations, TokenizerRefusalTest,
    ::testing::Values(
        Refusal{"MissingDecoder", [](json& d) { d.erase("decoder"); }, kInvalid,
                {"missing required key 'decoder'"}},
        Refusal{"UnknownTopLevelKey", [](json& d) { d["chat_template"] = "x"; }, kInvalid,
                {"'chat_template'", "unknown key"}},
        Refusal{"OtherVersion", [](json& d) { d["version"] = "2.0"; }, kUnimplemented,
                {"'version'", "\"1.0\"", "string \"2.0\""}},
        Refusal{"Truncation", [](json& d) { d["truncation"] = {{"max_length", 512}}; },
                kUnimplemented, {"'truncation'", "null (no truncation)", "object"}},
        Refusal{"Padding", [](json& d) { d["padding"] = {{"pad_id", 0}}; }, kUnimplemented,
                {"'padding'"}},
        Refusal{"Normalizer", [](json& d) { d["normalizer"] = {{"type", "NFC"}}; },
                kUnimplemented, {"'normalizer'", "null (no normalizer)"}},
        Refusal{"PostProcessor",
                [](json& d) { d["post_processor"] = {{"type", "ByteLevel"}}; }, kUnimplemented,
                {"'post_processor'"}},
        Refusal{"PreTokenizerNotSequence",
                [](json& d) { d["pre_tokenizer"] = PreTokenizerStep(d, 1); }, kUnimplemented,
                {"'pre_tokenizer.type'", "\"Sequence\"", "\"ByteLevel\""}},
        Refusal{"PreTokenizerNull", [](json& d) { d["pre_tokenizer"] = nullptr; }, kInvalid,
                {"'pre_tokenizer'", "null"}},
        Refusal{"OneStep",
                [](json& d) { d["pre_tokenizer"]["pretokenizers"].erase(1); }, kUnimplemented,
                {"'pre_tokenizer.pretokenizers'", "array of 1 elements"}},
        Refusal{"StepsSwapped",
                [](json& d) {
                  std::swap(PreTokenizerStep(d, 0), PreTokenizerStep(d, 1));
                },
                kUnimplemented, {"'pre_tokenizer.pretokenizers[0].type'", "\"Split\""}},
        Refusal{"StepNotObject", [](json& d) { PreTokenizerStep(d, 0) = 3; }, kInvalid,
                {"'pre_tokenizer.pretokenizers[0]'", "integer 3"}},
        Refusal{"OtherPattern",
                [](json& d) { PreTokenizerStep(d, 0)["pattern"]["Regex"] = "\\s+|\\S+"; },
                kUnimplemented,
                {"'pre_tokenizer.pretokenizers[0].pattern.Regex'", "\\\\s+|\\\\S+"}},
        Refusal{"StringPattern",
                [](json& d) { PreTokenizerStep(d, 0)["pattern"] = {{"String", " "}}; },
                kUnimplemented, {"'pre_tokenizer.pretokenizers[0].pattern'", "{\"Regex\": "}},
        Refusal{"RemovedBehavior",
                [](json& d) { PreTokenizerStep(d, 0)["behavior"] = "Removed"; }, kUnimplemented,
                {"'pre_tokenizer.pretokenizers[0].behavior'", "\"Isolated\"", "\"Removed\""}},
        Refusal{"Inverted", [](json& d) { PreTokenizerStep(d, 0)["invert"] = true; },
                kUnimplemented, {"'pre_tokenizer.pretokenizers[0].invert'", "boolean true"}},
        Refusal{"SplitMissingInvert", [](json& d) { PreTokenizerStep(d, 0).erase("invert"); },
                kInvalid, {"missing required key 'pre_tokenizer.pretokenizers[0].invert'"}},
        Refusal{"PrefixSpace",
                [](json& d) { PreTokenizerStep(d, 1)["add_prefix_space"] = true; },
                kUnimplemented, {"'pre_tokenizer.pretokenizers[1].add_prefix_space'"}},
        Refusal{"ByteLevelRegex", [](json& d) { PreTokenizerStep(d, 1)["use_regex"] = true; },
                kUnimplemented, {"'pre_tokenizer.pretokenizers[1].use_regex'", "false"}},
        Refusal{"ByteLevelUnknownKey", [](json& d) { PreTokenizerStep(d, 1)["lowercase"] = true; },
                kInvalid, {"'pre_tokenizer.pretokenizers[1].lowercase'", "unknown key"}},
        Refusal{"DecoderMissingFlag", [](json& d) { d["decoder"].erase("use_regex"); }, kInvalid,
                {"missing required key 'decoder.use_regex'"}},
        Refusal{"OtherDecoderType", [](json& d) { d["decoder"]["type"] = "BPEDecoder"; },
                kUnimplemented, {"'decoder.type'", "\"ByteLevel\"", "\"BPEDecoder\""}},
        Refusal{"WordPiece", [](json& d) { d["model"]["type"] = "WordPiece"; }, kUnimplemented,
                {"'model.type'", "\"BPE\"", "\"WordPiece\""}},
        Refusal{"Dropout", [](json& d) { d["model"]["dropout"] = 0.1; }, kUnimplemented,
                {"'model.dropout'", "null (no BPE dropout)", "number 0.1"}},
        Refusal{"UnkToken", [](json& d) { d["model"]["unk_token"] = "<unk>"; }, kUnimplemented,
                {"'model.unk_token'", "\"<unk>\""}},
        Refusal{"SubwordPrefix",
                [](json& d) { d["model"]["continuing_subword_prefix"] = "##"; }, kUnimplemented,
                {"'model.continuing_subword_prefix'", "\"##\""}},
        Refusal{"WordSuffix", [](json& d) { d["model"]["end_of_word_suffix"] = "</w>"; },
                kUnimplemented, {"'model.end_of_word_suffix'", "\"</w>\""}},
        Refusal{"ByteFallback", [](json& d) { d["model"]["byte_fallback"] = true; },
                kUnimplemented, {"'model.byte_fallback'", "boolean true"}},
        Refusal{"MissingIgnoreMerges", [](json& d) { d["model"].erase("ignore_merges"); },
                kInvalid, {"missing required key 'model.ignore_merges'"}},
        Refusal{"IgnoreMergesNotBool", [](json& d) { d["model"]["ignore_merges"] = 1; },
                kInvalid, {"'model.ignore_merges'", "integer 1"}},
        Refusal{"UnknownModelKey", [](json& d) { d["model"]["cache_capacity"] = 10; }, kInvalid,
                {"'model.cache_capacity'", "unknown key"}},
        Refusal{"DuplicatedId",
                [](json& d) { d["model"]["vocab"]["zz"] = d["model"]["vocab"]["a"]; }, kInvalid,
                {"'model.vocab.zz'", "is also the id of \"a\""}},
        Refusal{"IdOutOfRange", [](json& d) { d["model"]["vocab"]["a"] = 1000; }, kInvalid,
                {"'model.vocab.a'", "1000 is out of range [0, 999]"}},
        Refusal{"IdNotInteger", [](json& d) { d["model"]["vocab"]["a"] = "7"; }, kInvalid,
                {"'model.vocab.a'", "string \"7\""}},
        Refusal{"TooSmallVocab", [](json& d) { d["model"]["vocab"] = {{"a", 0}}; }, kInvalid,
                {"'model.vocab'", "1 tokens"}},
        Refusal{"MissingByteToken",
                [](json& d) {
                  json& vocab = d["model"]["vocab"];
                  vocab["renamed"] = vocab["\xC4\x8A"];  // "Ċ", the byte '\n'
                  vocab.erase("\xC4\x8A");
                },
                kInvalid, {"'model.vocab'", "no token for byte 0x0A", "initial_alphabet"}},
        Refusal{"MergeOfUnknownToken",
                [](json& d) { d["model"]["merges"][3] = {"a", "nonexistent"}; }, kInvalid,
                {"'model.merges[3]'", "token \"nonexistent\" is not in the vocab"}},
        Refusal{"MergedTokenNotInVocab",
                [](json& d) { d["model"]["merges"].push_back({"\xC4\x8A", "z"}); }, kInvalid,
                {"merged token \"\xC4\x8Az\" is not in the vocab"}},
        Refusal{"RepeatedMerge",
                [](json& d) { d["model"]["merges"].push_back(d["model"]["merges"][2]); },
                kInvalid, {"repeats merges[2]"}},
        Refusal{"MalformedMerge", [](json& d) { d["model"]["merges"][0] = {"a"}; }, kInvalid,
                {"'model.merges[0]'", "expected [left, right]", "array of 1 elements"}},
        Refusal{"MalformedStringMerge", [](json& d) { d["model"]["merges"][0] = "ab"; },
                kInvalid, {"'model.merges[0]'", "string \"ab\""}},
        Refusal{"MergesNotArray", [](json& d) { d["model"]["merges"] = json::object(); },
                kInvalid, {"'model.merges'", "expected an array"}},
        Refusal{"LstripAddedToken", [](json& d) { d["added_tokens"][0]["lstrip"] = true; },
                kUnimplemented, {"'added_tokens[0].lstrip'", "boolean true"}},
        Refusal{"SingleWordAddedToken",
                [](json& d) { d["added_tokens"][0]["single_word"] = true; }, kUnimplemented,
                {"'added_tokens[0].single_word'"}},
        Refusal{"NormalizedAddedToken",
                [](json& d) { d["added_tokens"][0]["normalized"] = true; }, kUnimplemented,
                {"'added_tokens[0].normalized'"}},
        Refusal{"AddedTokenOtherId", [](json& d) { d["added_tokens"][0]["id"] = 5; }, kInvalid,
                {"'added_tokens[0].id'", "has id 5 but the model vocab gives it id 0"}},
        Refusal{"AddedTokenNotInVocab",
                [](json& d) { d["added_tokens"][0]["content"] = "<|pad|>"; }, kInvalid,
                {"'added_tokens[0].id'", "\"<|pad|>\"", "does not hold it"}},
        Refusal{"AddedTokenTwice",
                [](json& d) { d["added_tokens"].push_back(d["added_tokens"][0]); }, kInvalid,
                {"'added_tokens[1].content'", "added twice"}},
        Refusal{"AddedTokenMissingSpecial",
                [](json& d) { d["added_tokens"][0].erase("special"); }, kInvalid,
                {"missing required key 'added_tokens[0].special'"}},
        Refusal{"AddedTokenEmpty",
                [](json& d) { d["added_tokens"][0]["content"] = ""; }, kInvalid,
                {"'added_tokens[0].content'", "is empty"}},
        Refusal{"AddedTokensNotArray", [](json& d) { d["added_tokens"] = nullptr; }, kInvalid,
                {"'added_tokens'", "expected an array, got null"}}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

TEST(TokenizerTest, RefusesDocumentsThatAreNotTokenizerObjects) {
  for (const std::string text : {"", "[1, 2]", "{\"version\": ", "\"tokenizer\""}) {
    const auto tokenizer = Tokenizer::FromJson(text, "bad.json");
    ASSERT_FALSE(tokenizer.ok()) << text;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(), HasSubstr("bad.json"));
  }
}

}  // namespace
}  // namespace eagle3

#include "eagle3/tools/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "json_fields.h"
#include "tokenizer_bpe.h"
#include "tokenizer_byte_level.h"
#include "tokenizer_code_split.h"
#include "tokenizer_utf8.h"

namespace eagle3 {
namespace {

using json_fields::Describe;
using json_fields::Object;
using json_fields::Sv;
using tokenizer_internal::BpeModel;

constexpr int64_t kMaxVocab = int64_t{1} << 24;

constexpr std::string_view kTopLevelKeys[] = {"version",        "truncation", "padding",
                                              "added_tokens",   "normalizer", "pre_tokenizer",
                                              "post_processor", "decoder",    "model"};
constexpr std::string_view kAddedTokenKeys[] = {"id",     "content",    "single_word", "lstrip",
                                                "rstrip", "normalized", "special"};
constexpr std::string_view kSequenceKeys[] = {"type", "pretokenizers"};
constexpr std::string_view kSplitKeys[] = {"type", "pattern", "behavior", "invert"};
constexpr std::string_view kByteLevelKeys[] = {"type", "add_prefix_space", "trim_offsets",
                                               "use_regex"};
constexpr std::string_view kModelKeys[] = {"type",
                                           "dropout",
                                           "unk_token",
                                           "continuing_subword_prefix",
                                           "end_of_word_suffix",
                                           "fuse_unk",
                                           "byte_fallback",
                                           "ignore_merges",
                                           "vocab",
                                           "merges"};

std::string Quoted(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

absl::Status RequireKeys(const Object& object, std::span<const std::string_view> keys) {
  for (std::string_view key : keys) {
    if (!object.Contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(object.source()), ": missing required key '", object.Path(key), "'"));
    }
  }
  return absl::OkStatus();
}

// The object member `key` (present: RequireKeys ran) as a raw json, which must be an object.
absl::StatusOr<const nlohmann::json*> ObjectMember(const Object& object, const nlohmann::json& json,
                                                   std::string_view key) {
  EAGLE3_RETURN_IF_ERROR(object.SubObject(key).status());
  return &json.find(key).value();
}

absl::StatusOr<const nlohmann::json*> ArrayMember(const Object& object, const nlohmann::json& json,
                                                  std::string_view key) {
  const nlohmann::json& value = json.find(key).value();
  if (!value.is_array()) {
    return object.Error(absl::StatusCode::kInvalidArgument, key,
                        absl::StrCat("expected an array, got ", Describe(value)));
  }
  return &value;
}

// A feature this tokenizer does not implement: `what` explains the expected value.
absl::Status Unsupported(const Object& object, std::string_view key, const nlohmann::json& found,
                         std::string_view expected) {
  return object.Error(absl::StatusCode::kUnimplemented, key,
                      absl::StrCat("expected ", Sv(expected), ", got ", Describe(found),
                                   "; eagle3's tokenizer implements only the byte-level BPE "
                                   "pipeline described in eagle3/tools/tokenizer.h"));
}

absl::Status ExpectNull(const Object& object, const nlohmann::json& json, std::string_view key,
                        std::string_view expected) {
  const nlohmann::json& value = json.find(key).value();
  if (!value.is_null()) return Unsupported(object, key, value, expected);
  return absl::OkStatus();
}

absl::Status ExpectString(const Object& object, const nlohmann::json& json, std::string_view key,
                          std::string_view expected) {
  EAGLE3_ASSIGN_OR_RETURN(const std::string value, object.String(key));
  if (value != expected) return Unsupported(object, key, json.find(key).value(), Quoted(expected));
  return absl::OkStatus();
}

absl::Status ExpectBool(const Object& object, const nlohmann::json& json, std::string_view key,
                        bool expected) {
  EAGLE3_ASSIGN_OR_RETURN(const bool value, object.Bool(key));
  if (value != expected) {
    return Unsupported(object, key, json.find(key).value(), expected ? "true" : "false");
  }
  return absl::OkStatus();
}

// An object in a tokenizer.json with its path, checked for unknown and missing keys. A component
// with a `type` (`type` non-empty) has it checked first, so that a component of another kind is
// refused as such rather than for its keys.
absl::StatusOr<Object> Component(const nlohmann::json& json, std::string_view source,
                                 std::string_view path, std::span<const std::string_view> keys,
                                 std::string_view type = "") {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": key '", Sv(path),
                                                   "': expected an object, got ", Describe(json)));
  }
  Object object(json, source, path);
  if (!type.empty()) {
    constexpr std::string_view kTypeKey[] = {"type"};
    EAGLE3_RETURN_IF_ERROR(RequireKeys(object, kTypeKey));
    EAGLE3_RETURN_IF_ERROR(ExpectString(object, json, "type", type));
  }
  EAGLE3_RETURN_IF_ERROR(object.CheckKnownKeys({keys}));
  EAGLE3_RETURN_IF_ERROR(RequireKeys(object, keys));
  return object;
}

// ByteLevel as pre-tokenizer or decoder. `trim_offsets` changes offsets only, never ids; the
// decoder ignores all three flags.
absl::Status CheckByteLevel(const nlohmann::json& json, std::string_view source,
                            std::string_view path, bool is_pre_tokenizer) {
  EAGLE3_ASSIGN_OR_RETURN(const Object object,
                          Component(json, source, path, kByteLevelKeys, "ByteLevel"));
  if (is_pre_tokenizer) {
    EAGLE3_RETURN_IF_ERROR(ExpectBool(object, json, "add_prefix_space", false));
    EAGLE3_RETURN_IF_ERROR(ExpectBool(object, json, "use_regex", false));
    return object.Bool("trim_offsets").status();
  }
  for (std::string_view key : {"add_prefix_space", "trim_offsets", "use_regex"}) {
    EAGLE3_RETURN_IF_ERROR(object.Bool(key).status());
  }
  return absl::OkStatus();
}

absl::Status CheckSplit(const nlohmann::json& json, std::string_view source,
                        std::string_view path) {
  EAGLE3_ASSIGN_OR_RETURN(const Object object, Component(json, source, path, kSplitKeys, "Split"));
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* pattern_json,
                          ObjectMember(object, json, "pattern"));
  const Object pattern(*pattern_json, source, object.Path("pattern"));
  if (!pattern.Contains("Regex")) {
    return Unsupported(object, "pattern", *pattern_json,
                       absl::StrCat("{\"Regex\": ", Quoted(kCodeSplitPattern), "}"));
  }
  constexpr std::string_view kRegexKey[] = {"Regex"};
  EAGLE3_RETURN_IF_ERROR(pattern.CheckKnownKeys({kRegexKey}));
  EAGLE3_RETURN_IF_ERROR(ExpectString(pattern, *pattern_json, "Regex", kCodeSplitPattern));
  EAGLE3_RETURN_IF_ERROR(ExpectString(object, json, "behavior", "Isolated"));
  return ExpectBool(object, json, "invert", false);
}

absl::Status CheckPreTokenizer(const Object& root, const nlohmann::json& root_json) {
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* json,
                          ObjectMember(root, root_json, "pre_tokenizer"));
  const std::string_view source = root.source();
  EAGLE3_ASSIGN_OR_RETURN(const Object object,
                          Component(*json, source, "pre_tokenizer", kSequenceKeys, "Sequence"));
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* steps, ArrayMember(object, *json, "pretokenizers"));
  if (steps->size() != 2) {
    return Unsupported(object, "pretokenizers", *steps, "2 elements: Split, then ByteLevel");
  }
  EAGLE3_RETURN_IF_ERROR(CheckSplit((*steps)[0], source, "pre_tokenizer.pretokenizers[0]"));
  return CheckByteLevel((*steps)[1], source, "pre_tokenizer.pretokenizers[1]",
                        /*is_pre_tokenizer=*/true);
}

struct Vocabulary {
  std::vector<std::string> tokens;  // id -> token as written
  std::unordered_map<std::string, int32_t> ids;
};

absl::StatusOr<Vocabulary> ReadVocabulary(const Object& model, const nlohmann::json& model_json) {
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* json, ObjectMember(model, model_json, "vocab"));
  const Object vocab(*json, model.source(), model.Path("vocab"));
  const int64_t size = static_cast<int64_t>(json->size());
  if (size < 256 || size > kMaxVocab) {
    return model.Error(absl::StatusCode::kInvalidArgument, "vocab",
                       absl::StrCat(size, " tokens; expected [256, ", kMaxVocab,
                                    "] (the 256 byte tokens at least)"));
  }
  Vocabulary out;
  out.tokens.resize(static_cast<size_t>(size));
  std::vector<bool> seen(static_cast<size_t>(size), false);
  out.ids.reserve(static_cast<size_t>(size));
  for (const auto& [token, value] : json->items()) {
    EAGLE3_ASSIGN_OR_RETURN(const int64_t id, vocab.Int(token, 0, size - 1));
    if (seen[id]) {
      return vocab.Error(absl::StatusCode::kInvalidArgument, token,
                         absl::StrCat("id ", id, " is also the id of ", Quoted(out.tokens[id]),
                                      "; ids must be unique"));
    }
    seen[id] = true;
    out.tokens[id] = token;
    out.ids.emplace(token, static_cast<int32_t>(id));
  }
  // Unique ids in [0, size) over `size` tokens cover the range: no id is missing.
  return out;
}

absl::StatusOr<std::vector<BpeModel::Merge>> ReadMerges(const Object& model,
                                                        const nlohmann::json& model_json,
                                                        const Vocabulary& vocab) {
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* json, ArrayMember(model, model_json, "merges"));
  std::vector<BpeModel::Merge> merges;
  merges.reserve(json->size());
  std::unordered_map<std::string, size_t> first_index;  // "left right" -> index
  for (size_t i = 0; i < json->size(); ++i) {
    const nlohmann::json& entry = (*json)[i];
    const std::string key = absl::StrCat("merges[", i, "]");
    std::string parts[2];
    if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      parts[0] = entry[0].get<std::string>();
      parts[1] = entry[1].get<std::string>();
    } else if (entry.is_string() &&
               std::count(entry.get_ref<const std::string&>().begin(),
                          entry.get_ref<const std::string&>().end(), ' ') == 1) {
      // The older "left right" form; byte-level tokens never hold a space.
      const std::string& text = entry.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      parts[0] = text.substr(0, space);
      parts[1] = text.substr(space + 1);
    } else {
      return model.Error(
          absl::StatusCode::kInvalidArgument, key,
          absl::StrCat("expected [left, right] (two strings) or \"left right\", got ",
                       Describe(entry)));
    }
    int32_t ids[2];
    for (int side = 0; side < 2; ++side) {
      const auto it = vocab.ids.find(parts[side]);
      if (it == vocab.ids.end()) {
        return model.Error(absl::StatusCode::kInvalidArgument, key,
                           absl::StrCat("token ", Quoted(parts[side]), " is not in the vocab"));
      }
      ids[side] = it->second;
    }
    const auto merged = vocab.ids.find(parts[0] + parts[1]);
    if (merged == vocab.ids.end()) {
      return model.Error(
          absl::StatusCode::kInvalidArgument, key,
          absl::StrCat("the merged token ", Quoted(parts[0] + parts[1]), " is not in the vocab"));
    }
    const auto [it, inserted] = first_index.emplace(absl::StrCat(parts[0], " ", parts[1]), i);
    if (!inserted) {
      return model.Error(absl::StatusCode::kInvalidArgument, key,
                         absl::StrCat("merge of ", Quoted(parts[0]), " and ", Quoted(parts[1]),
                                      " repeats merges[", it->second, "]"));
    }
    merges.push_back({ids[0], ids[1], merged->second});
  }
  return merges;
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

absl::StatusOr<std::vector<AddedToken>> ReadAddedTokens(const Object& root,
                                                        const nlohmann::json& root_json,
                                                        const Vocabulary& vocab) {
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* json, ArrayMember(root, root_json, "added_tokens"));
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < json->size(); ++i) {
    const nlohmann::json& entry = (*json)[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    EAGLE3_ASSIGN_OR_RETURN(const Object token,
                            Component(entry, root.source(), path, kAddedTokenKeys));
    // Stripping, whole-word matching and matching after normalization are not implemented.
    for (std::string_view flag : {"single_word", "lstrip", "rstrip", "normalized"}) {
      EAGLE3_RETURN_IF_ERROR(ExpectBool(token, entry, flag, false));
    }
    EAGLE3_ASSIGN_OR_RETURN(const bool special, token.Bool("special"));
    EAGLE3_ASSIGN_OR_RETURN(std::string content, token.String("content"));
    EAGLE3_ASSIGN_OR_RETURN(const int64_t id,
                            token.Int("id", 0, std::numeric_limits<int32_t>::max()));
    if (content.empty()) {
      return token.Error(absl::StatusCode::kInvalidArgument, "content", "is empty");
    }
    const auto in_vocab = vocab.ids.find(content);
    if (in_vocab == vocab.ids.end() || in_vocab->second != id) {
      return token.Error(
          absl::StatusCode::kInvalidArgument, "id",
          absl::StrCat("added token ", Quoted(content), " has id ", id, " but the model vocab ",
                       in_vocab == vocab.ids.end() ? std::string("does not hold it")
                                                   : absl::StrCat("gives it id ", in_vocab->second),
                       "; added tokens must be vocab entries with the same id"));
    }
    for (const AddedToken& other : tokens) {
      if (other.content == content) {
        return token.Error(absl::StatusCode::kInvalidArgument, "content",
                           absl::StrCat(Quoted(content), " is added twice"));
      }
    }
    tokens.push_back({std::move(content), static_cast<int32_t>(id), special});
  }
  return tokens;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> tokens;       // id -> token as written in the vocab
  std::vector<std::string> token_bytes;  // id -> bytes the ByteLevel decoder gives
  std::vector<bool> special;             // id -> special added token
  std::unordered_map<std::string, int32_t> ids;
  std::vector<AddedToken> added;
  // First byte -> indices into `added`, longest content first (leftmost-longest matching).
  std::array<std::vector<size_t>, 256> added_by_first_byte;
  BpeModel bpe;

  explicit Impl(BpeModel model) : bpe(std::move(model)) {}

  // The added token that starts at text[pos], longest first; nullptr if none.
  const AddedToken* AddedTokenAt(std::string_view text, size_t pos) const {
    for (size_t index : added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
      const AddedToken& token = added[index];
      if (text.compare(pos, token.content.size(), token.content) == 0) return &token;
    }
    return nullptr;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::filesystem::path& tokenizer_json) {
  // Size-capped, and FIFOs or directories are refused before any blocking open.
  std::string resolved;
  EAGLE3_ASSIGN_OR_RETURN(
      const std::string text,
      json_fields::ReadJsonFile(tokenizer_json.string(), json_fields::kTokenizerLimits, &resolved));
  return FromJson(text, resolved);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json, std::string_view source_name) {
  EAGLE3_ASSIGN_OR_RETURN(
      const nlohmann::json document,
      json_fields::ParseObjectDocument(json, source_name, json_fields::kTokenizerLimits));
  const Object root(document, source_name, "");
  EAGLE3_RETURN_IF_ERROR(root.CheckKnownKeys({kTopLevelKeys}));
  EAGLE3_RETURN_IF_ERROR(RequireKeys(root, kTopLevelKeys));
  EAGLE3_RETURN_IF_ERROR(ExpectString(root, document, "version", "1.0"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(root, document, "truncation", "null (no truncation)"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(root, document, "padding", "null (no padding)"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(root, document, "normalizer", "null (no normalizer)"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(root, document, "post_processor", "null (no post-processor)"));
  EAGLE3_RETURN_IF_ERROR(CheckPreTokenizer(root, document));
  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* decoder, ObjectMember(root, document, "decoder"));
  EAGLE3_RETURN_IF_ERROR(CheckByteLevel(*decoder, source_name, "decoder",
                                        /*is_pre_tokenizer=*/false));

  EAGLE3_ASSIGN_OR_RETURN(const nlohmann::json* model_json, ObjectMember(root, document, "model"));
  EAGLE3_ASSIGN_OR_RETURN(const Object model,
                          Component(*model_json, source_name, "model", kModelKeys, "BPE"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(model, *model_json, "dropout", "null (no BPE dropout)"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(model, *model_json, "unk_token", "null (no unknown token)"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(model, *model_json, "continuing_subword_prefix", "null"));
  EAGLE3_RETURN_IF_ERROR(ExpectNull(model, *model_json, "end_of_word_suffix", "null"));
  EAGLE3_RETURN_IF_ERROR(ExpectBool(model, *model_json, "byte_fallback", false));
  // fuse_unk only joins unknown tokens, and there is no unknown token.
  EAGLE3_RETURN_IF_ERROR(model.Bool("fuse_unk").status());
  EAGLE3_ASSIGN_OR_RETURN(const bool ignore_merges, model.Bool("ignore_merges"));

  EAGLE3_ASSIGN_OR_RETURN(Vocabulary vocab, ReadVocabulary(model, *model_json));
  std::array<int32_t, 256> byte_ids;
  for (int byte = 0; byte < 256; ++byte) {
    const std::string token =
        tokenizer_internal::ToByteLevel(std::string(1, static_cast<char>(byte)));
    const auto it = vocab.ids.find(token);
    if (it == vocab.ids.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      return model.Error(absl::StatusCode::kInvalidArgument, "vocab",
                         absl::StrCat("no token for byte ", hex, " (", Quoted(token),
                                      "); a byte-level BPE needs all 256 (train with "
                                      "initial_alphabet=ByteLevel.alphabet())"));
    }
    byte_ids[byte] = it->second;
  }
  EAGLE3_ASSIGN_OR_RETURN(const std::vector<BpeModel::Merge> merges,
                          ReadMerges(model, *model_json, vocab));
  EAGLE3_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ReadAddedTokens(root, document, vocab));

  const size_t size = vocab.tokens.size();
  std::vector<std::string> token_bytes(size);
  std::unordered_map<std::string, int32_t> whole_words;
  for (size_t id = 0; id < size; ++id) {
    const std::string& token = vocab.tokens[id];
    std::optional<std::string> bytes = tokenizer_internal::FromByteLevel(token);
    if (bytes.has_value()) {
      if (ignore_merges) whole_words.emplace(*bytes, static_cast<int32_t>(id));
      token_bytes[id] = *std::move(bytes);
    } else {
      token_bytes[id] = token;  // as the ByteLevel decoder does: the token's own UTF-8
    }
  }

  auto impl = std::make_unique<Impl>(BpeModel(byte_ids, merges, std::move(whole_words)));
  impl->source = std::string(source_name);
  impl->tokens = std::move(vocab.tokens);
  impl->ids = std::move(vocab.ids);
  impl->token_bytes = std::move(token_bytes);
  impl->special.assign(size, false);
  for (const AddedToken& token : added) impl->special[token.id] = token.special;
  impl->added = std::move(added);
  for (size_t i = 0; i < impl->added.size(); ++i) {
    impl->added_by_first_byte[static_cast<uint8_t>(impl->added[i].content[0])].push_back(i);
  }
  for (std::vector<size_t>& candidates : impl->added_by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return impl->added[a].content.size() > impl->added[b].content.size();
    });
  }
  return Tokenizer(std::move(impl));
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(std::string_view utf8_text) const {
  if (const std::optional<size_t> bad = tokenizer_internal::FirstInvalidUtf8(utf8_text)) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<uint8_t>(utf8_text[*bad]));
    return absl::InvalidArgumentError(
        absl::StrCat("Tokenizer::Encode (", impl_->source, "): text is not valid UTF-8: byte ", hex,
                     " at offset ", *bad, " does not start a well-formed sequence"));
  }
  std::vector<int64_t> ids;
  ids.reserve(utf8_text.size() / 3 + 1);
  // Pieces repeat a lot in real text: remember each piece's ids for this call.
  struct Span {
    size_t begin;
    size_t count;
  };
  std::unordered_map<std::string_view, Span> cache;
  std::vector<int64_t> cached_ids;
  const auto encode_segment = [&](std::string_view segment) {
    size_t pos = 0;
    while (pos < segment.size()) {
      const size_t length = tokenizer_internal::CodeSplitPieceLength(segment, pos);
      const std::string_view piece = segment.substr(pos, length);
      pos += length;
      auto [it, inserted] = cache.try_emplace(piece, Span{cached_ids.size(), 0});
      if (inserted) {
        impl_->bpe.EncodeWord(piece, &cached_ids);
        it->second.count = cached_ids.size() - it->second.begin;
      }
      const auto first = cached_ids.begin() + static_cast<ptrdiff_t>(it->second.begin);
      ids.insert(ids.end(), first, first + static_cast<ptrdiff_t>(it->second.count));
    }
  };
  size_t segment_begin = 0;
  size_t pos = 0;
  while (pos < utf8_text.size()) {
    const AddedToken* added = impl_->AddedTokenAt(utf8_text, pos);
    if (added == nullptr) {
      ++pos;
      continue;
    }
    encode_segment(utf8_text.substr(segment_begin, pos - segment_begin));
    ids.push_back(added->id);
    pos += added->content.size();
    segment_begin = pos;
  }
  encode_segment(utf8_text.substr(segment_begin));
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int64_t> ids,
                                              SpecialTokens special) const {
  const int64_t size = vocab_size();
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= size) {
      return absl::InvalidArgumentError(absl::StrCat("Tokenizer::Decode (", impl_->source,
                                                     "): ids[", i, "] = ", id,
                                                     " is out of range [0, ", size, ")"));
    }
    if (special == SpecialTokens::kSkip && impl_->special[id]) continue;
    bytes += impl_->token_bytes[id];
  }
  return tokenizer_internal::LossyUtf8(bytes);
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::optional<int64_t> Tokenizer::TokenId(std::string_view token) const {
  const auto it = impl_->ids.find(std::string(token));
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::Token(int64_t id) const {
  if (id < 0 || id >= vocab_size()) return std::nullopt;
  return impl_->tokens[id];
}

bool Tokenizer::IsSpecial(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

}  // namespace eagle3

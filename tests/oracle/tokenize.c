/* llama.cpp's own tokenizer as an oracle: the token ids of a UTF-8 text file, as llama-perplexity takes them.
 *   tokenize MODEL.gguf TEXT OUT.i32 [parse_special]
 * loads the vocabulary only and writes the ids of the whole file as int32, BOS (or whatever the model's
 * add_special adds) included: llama_tokenize(add_special = true, parse_special = false unless a fourth
 * argument is given), which is common_tokenize(ctx, text, true) of tools/perplexity/perplexity.cpp.
 * Exit 0, or 1 with one line. */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: tokenize MODEL.gguf TEXT OUT.i32 [parse_special]\n"); return 1; }
    FILE *f = fopen(argv[2], "rb");
    if (!f) { fprintf(stderr, "%s: cannot read\n", argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "%s: cannot read\n", argv[2]); return 1; }
    text[n] = 0;
    fclose(f);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = 1;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "%s: llama.cpp cannot load it\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int cap = (int)n + 16;
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
    int k = llama_tokenize(vocab, text, (int)n, ids, cap, 1, argc > 4);
    if (k < 0) { fprintf(stderr, "%s: llama_tokenize failed (%d)\n", argv[2], k); return 1; }
    FILE *o = fopen(argv[3], "wb");
    if (!o || fwrite(ids, sizeof(llama_token), (size_t)k, o) != (size_t)k) {
        fprintf(stderr, "%s: cannot write\n", argv[3]);
        return 1;
    }
    fclose(o);
    free(ids);
    free(text);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

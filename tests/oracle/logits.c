/* llama.cpp's own CPU forward pass as an oracle: every token's logits of a GGUF on a token sequence.
 *   logits MODEL.gguf OUT.f32 ID [ID ...]
 * writes T x n_vocab float32 (row t: the logits after token t), one decode of the whole sequence on the CPU
 * (no GPU layers), one sequence, the context and the batch as long as the sequence. Exit 0, or 1 with one line. */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: logits MODEL.gguf OUT.f32 ID [ID ...]\n"); return 1; }
    int n = argc - 3;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "%s: llama.cpp cannot load it\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = (uint32_t)(n < 64 ? 64 : n);
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "%s: no llama.cpp context\n", argv[1]); return 1; }
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[3 + i]);
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "%s: llama_decode failed\n", argv[1]); return 1; }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(argv[2], "wb");
    if (!f) { fprintf(stderr, "%s: cannot write\n", argv[2]); return 1; }
    for (int i = 0; i < n; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row || fwrite(row, sizeof(float), (size_t)nv, f) != (size_t)nv) {
            fprintf(stderr, "%s: no logits for token %d\n", argv[1], i);
            return 1;
        }
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

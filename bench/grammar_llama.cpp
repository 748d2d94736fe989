// llama.cpp grammar-sampler harness for bench/grammar_compare.py (not part of the CMake build:
// compiled by the script against llama.cpp's source from the llama-cpp-python sdist). For each
// document (a line of token ids) it creates a grammar sampler (compile time), then per step
// times llama_sampler_apply over the whole vocabulary (the mask) and accepts the document token.
//   grammar_llama VOCAB.gguf GRAMMAR.gbnf IDS.txt
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "llama.h"

static double pct(std::vector<double> &v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(size_t)(p * (double)(v.size() - 1) + 0.5)];
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: grammar_llama VOCAB.gguf GRAMMAR.gbnf IDS.txt\n");
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model *model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const llama_vocab *vocab = llama_model_get_vocab(model);
  int n_vocab = llama_vocab_n_tokens(vocab);
  std::ifstream gf(argv[2]);
  std::stringstream gs;
  gs << gf.rdbuf();
  std::string grammar = gs.str();
  std::ifstream idf(argv[3]);
  std::string line;
  std::vector<double> masks, compiles;
  std::vector<llama_token_data> cur(n_vocab);
  int docs = 0, bad = 0;
  while (std::getline(idf, line)) {
    std::vector<llama_token> ids;
    std::istringstream ls(line);
    long x;
    while (ls >> x) ids.push_back((llama_token)x);
    auto c0 = std::chrono::steady_clock::now();
    llama_sampler *smpl = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
    auto c1 = std::chrono::steady_clock::now();
    if (!smpl) return 1;
    compiles.push_back(std::chrono::duration<double, std::milli>(c1 - c0).count());
    for (size_t k = 0; k <= ids.size(); k++) {
      for (int i = 0; i < n_vocab; i++) cur[i] = {i, 0.0f, 0.0f};
      llama_token_data_array arr = {cur.data(), cur.size(), -1, false};
      auto t0 = std::chrono::steady_clock::now();
      llama_sampler_apply(smpl, &arr);
      auto t1 = std::chrono::steady_clock::now();
      masks.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (k == ids.size()) break;
      if (cur[ids[k]].logit == -INFINITY) {
        if (bad++ < 3) fprintf(stderr, "document %d: token %zu (id %d) rejected by llama.cpp\n", docs, k, ids[k]);
        break;
      }
      llama_sampler_accept(smpl, ids[k]);
    }
    llama_sampler_free(smpl);
    docs++;
  }
  printf("documents %d (rejected %d), mask calls %zu\n", docs, bad, masks.size());
  double med = pct(masks, 0.5), p99 = pct(masks, 0.99), mx = masks.empty() ? 0 : masks.back();
  printf("mask us: median %.2f  p90 %.2f  p99 %.2f  max %.1f\n", med, pct(masks, 0.9), p99, mx);
  printf("compile ms: median %.3f\n", pct(compiles, 0.5));
  llama_model_free(model);
  return bad ? 1 : 0;
}

"""Word vectors trained from scratch: Word2Vec (skip-gram, CBOW), FastText and GloVe.

    from attnlab.wordvec import VectorsConfig, train_vectors, load_vectors
    train_vectors("runs/w2v", VectorsConfig(method="skipgram"))   # the built-in English corpus
    load_vectors("runs/w2v").analogy("man", "king", "woman")

corpus: words, vocabulary, subsampling and noise; sgns: the Word2Vec/FastText kernel; subwords:
FastText's n-grams; glove: co-occurrences and their fit; keyed: the trained vectors and their
queries; evaluate: analogy questions and similarity ratings; train: the run folder.
"""

from attnlab.wordvec.config import METHODS, VectorsConfig
from attnlab.wordvec.keyed import WordVectors, load_vectors
from attnlab.wordvec.train import train_vectors

__all__ = ["METHODS", "VectorsConfig", "WordVectors", "load_vectors", "train_vectors"]

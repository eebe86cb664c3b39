"""The digits toy of the default pipeline: scikit-learn's 8x8 digits, their classifiers, the judge metrics, the
adherence reward and the MiniLM text encoder, registered through flowpost's entry points (extra ``digits``)."""

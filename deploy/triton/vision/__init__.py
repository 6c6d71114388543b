"""Images in the pipeline: a checkpoint's vision settings, image decoding and processing, the
placeholder ids of image features, and the vision tower that computes them."""

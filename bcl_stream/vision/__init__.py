"""Image-text records: image geometry per model family, image headers, stored cost components."""

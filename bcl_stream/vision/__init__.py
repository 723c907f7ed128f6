"""Image-text records: image geometry, per-record cost components and the two-term cost."""

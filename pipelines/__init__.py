"""CLI, validated config model, and Beam graph assembly per release kind."""

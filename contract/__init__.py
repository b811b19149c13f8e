"""The contract between the pipeline (`flows/`) and the service (`serving/`): registry names and store, the model
card, and the signed manifest every registered version carries. Both sides import it; it imports neither."""

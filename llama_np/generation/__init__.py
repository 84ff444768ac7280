"""Using a model: sampling, the generation loop with stop strings and streamed text, chat
sessions with templates, perplexity."""

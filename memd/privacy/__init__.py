"""Privacy controls: forget exchanges for good, export a client's memory, import it back."""

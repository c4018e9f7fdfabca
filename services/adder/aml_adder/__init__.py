"""adder: writes benchmark chunks into the participant's memory through its Add endpoint."""

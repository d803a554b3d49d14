"""Tools for planning a fleet's maintenance: buffer sizing and fleet studies on the simulator."""

"""The local stack (Airflow standalone, the fleet simulator) and the demo train that runs on it."""

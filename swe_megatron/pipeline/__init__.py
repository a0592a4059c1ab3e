"""The pipeline: RFT -> DAPO stage 1 -> stage 2 -> eval as synchronous, resumable iterations (driver.py)."""

"""The block delta: where a changed object matches what the target holds (``match``), the source's
chunks read and hashed (``read``), the target objects to compose from (``bases``), and the plan of
one delta upload (``planner``). Sends nothing."""

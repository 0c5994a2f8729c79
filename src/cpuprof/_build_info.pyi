TORCH_VERSION: str
LIMITS: dict[str, int]

"""quantize"""

"""placeholder"""
def main():
    print("hi")
